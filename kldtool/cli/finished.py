"""Commands over finished runs: ``merge`` (compare shards into one run's statistics),
``report`` (one table and plots for many quants against one base file) and ``diff`` (two
quants, paired chunk by chunk: is the difference real)."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from kldtool.cli.app import app
from kldtool.cli.flag_groups import BOOTSTRAP
from kldtool.cli.options import bootstrap_of, flags
from kldtool.errors import UsageError


@app.command()
@flags(bootstrap_flags=BOOTSTRAP)
def merge(
    states: list[str] = typer.Argument(
        ..., help="State files of compare shards (compare --chunk-range A:B --state FILE)."
    ),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write every statistic and the shards' metadata here."),
    force: bool = typer.Option(False, "--force", help="Merge shards even when their models' names differ."),
    mix: bool = typer.Option(
        False,
        "--mix",
        help="Merge shards even when their manifests (engine, versions, dtype, device, instruction set...) differ.",
    ),
    bootstrap_flags=None,
):
    """Combine compare shards into the statistics of one run over all their chunks."""
    from kldtool.pipeline.merge import run_merge

    run_merge(states, json_path=json_out, force=force, bootstrap=bootstrap_of(bootstrap_flags), mix=mix)


@app.command()
@flags(bootstrap_flags=BOOTSTRAP)
def report(
    results: list[str] = typer.Argument(
        ...,
        help="compare/merge --json results and compare --per-token .h5 files (those of one model are pooled); "
        "generate corpora (.jsonl: degeneration side by side); compare --generated --json results (ranked); "
        "recipe results (OUT/recipe.json: the frontier, rounds and proof).",
    ),
    markdown: Optional[str] = typer.Option(None, "--markdown", help="Write the table as Markdown here."),
    csv_out: Optional[str] = typer.Option(None, "--csv", help="Write the table as CSV (full precision) here."),
    card_out: Optional[str] = typer.Option(
        None, "--card", help="Write a model card's Markdown block here: the table and its receipts."
    ),
    plots: Optional[str] = typer.Option(None, "--plots", help="Write PNG plots into this directory."),
    html_out: Optional[str] = typer.Option(
        None,
        "--html",
        help="Write one self-contained HTML page here: table, "
        "paired comparisons, plots, and the worst windows "
        "token by token for per-token inputs.",
    ),
    title: Optional[str] = typer.Option(None, "--title", help="Title of the table and Markdown."),
    mix: bool = typer.Option(
        False,
        "--mix",
        help="Report results of different base files or protocols, or whose manifests disagree, together.",
    ),
    paired: bool = typer.Option(
        False,
        "--paired",
        help="Pair every two quants' mean KLD chunk by chunk (default: each against the next larger one).",
    ),
    noise_floor: Optional[str] = typer.Option(
        None,
        "--noise-floor",
        help="A `kldtool noise-floor --json` result of the base file: differences below it are labelled so.",
    ),
    bootstrap_flags=None,
):
    """One table (and plots) for many quants compared against one base file, sorted by size."""
    from kldtool.report import table
    from kldtool.analysis.ordering import ordering
    from kldtool.pipeline.floor_file import read_floor
    from kldtool.analysis.results import load_results
    from kldtool.runtime.small_files import write_text

    from kldtool.report.degeneration import corpora_among

    corpora, results = corpora_among(results)
    if _report_of_its_own(corpora, results, markdown, html_out, title):
        return
    rows = load_results(results, mix=mix)
    if card_out:  # before anything is printed: runs of two references are refused in one line
        from kldtool.report.card import card

        write_text(card_out, card(rows, title))
    floor_kld = read_floor(noise_floor, rows[0].base, rows[0].sources[0])["kld_mean"] if noise_floor else None
    pairs = ordering(rows, bootstrap_of(bootstrap_flags), every=paired, noise_floor=floor_kld)
    table.console(rows, title)
    if corpora:
        from kldtool.report.degeneration import console as degeneration_console

        degeneration_console(corpora)
    if pairs:
        print("\n".join(pairs))
    per_token = [r for r in rows if r.sources[0].endswith((".h5", ".hdf5"))]
    splits = _breakdowns(per_token) if (markdown or html_out) else []
    if markdown:
        from kldtool.report.breakdown import breakdown_markdown

        listed = "".join(f"\n{pairs[0]}\n\n" if i == 0 else f"- {p.strip()}\n" for i, p in enumerate(pairs))
        parts = [breakdown_markdown(r.label, out) for r, outs in splits if not isinstance(outs, str) for out in outs]
        from kldtool.report.routing import routing_markdown

        text = table.markdown(rows, title) + listed + "".join("\n" + p for p in parts) + routing_markdown(rows)
        if corpora:
            from kldtool.report.degeneration import markdown as degeneration_markdown

            text += "\n" + degeneration_markdown(corpora)
        write_text(markdown, text)
    if csv_out:
        write_text(csv_out, table.csv_text(rows))
    if plots:
        from kldtool.report.plots import write_plots

        for path in write_plots(rows, plots):
            print(f"report: wrote {path}", file=sys.stderr)
    if html_out:
        from kldtool.analysis.worst import window_views
        from kldtool.report.html import WINDOWS, render

        views = []
        for r in per_token:
            try:
                views.append((r, window_views(r.sources[0], WINDOWS)))
            except Exception as e:  # a moved base file or model: the page still has everything else
                views.append((r, str(e)))
        write_text(html_out, render(rows, pairs, title, views, splits))
        print(f"report: wrote {html_out}", file=sys.stderr)


def _report_of_its_own(corpora: list, results: list[str], markdown: str | None, html_out, title) -> bool:
    """Generated corpora alone (their degeneration), audits of served models alone, or recipes."""
    from kldtool.report import degeneration, providers, recipes
    from kldtool.runtime.small_files import write_text

    if corpora and not results:
        degeneration.console(corpora)
        if markdown:
            write_text(markdown, degeneration.markdown(corpora))
        return True
    return providers.report_audits(results, markdown) or recipes.report_recipes(results, markdown, html_out, title)


def _breakdowns(rows) -> list:
    """Each per-token row's breakdowns by depth and kind, or why it has none (a moved base file
    or tokenizer: the report still has everything else)."""
    from kldtool.analysis.breakdown import BY, breakdown

    out = []
    for r in rows:
        try:
            out.append((r, [breakdown(r.sources, by) for by in BY]))
        except Exception as e:
            out.append((r, str(e)))
    return out


@app.command()
@flags(bootstrap_flags=BOOTSTRAP)
def diff(
    a: str = typer.Argument(..., help="Run A: compare --per-token .h5, --state, or --generated --json result."),
    b: str = typer.Argument(..., help="Run B, against the same base file over the same chunks."),
    json_out: Optional[str] = typer.Option(
        None, "--json", help="Write both runs' values, A − B, intervals and chunk wins here."
    ),
    mix: bool = typer.Option(
        False, "--mix", help="Pair runs whose manifests (dtype, device, instruction set...) disagree."
    ),
    bootstrap_flags=None,
):
    """Two quants against one base file, paired chunk by chunk: A − B with a paired block
    bootstrap interval and chunk wins for mean KLD, ln PPL ratio, same top p and RMS Δp."""
    from kldtool.analysis.diff import run_diff
    from kldtool.report.diff import print_diff
    from kldtool.runtime.small_files import write_json

    result = run_diff(a, b, bootstrap_of(bootstrap_flags), mix=mix)
    print_diff(result)
    if json_out:
        write_json(json_out, result)


@app.command()
def worst(
    result: str = typer.Argument(..., help="A compare --per-token .h5 file."),
    n: int = typer.Option(20, "-n", help="How many rows."),
    by: str = typer.Option(
        "kld",
        "--by",
        help="kld (largest KLD), dp (largest |Δp|), nll (largest rise of the "
        "target's NLL), routing (earliest MoE routing departure) or window (chunks by mean KLD); or a "
        "breakdown of the whole run: depth (by position in the window) or kind (by kind of token, and each --class).",
    ),
    classes: List[str] = typer.Option(
        [],
        "--class",
        help="With --by kind: also a class of tokens, NAME=REGEX (over the token's text) or NAME=@FILE (token ids).",
    ),
    context: int = typer.Option(
        12, "--context", help="Tokens of text shown before each position (window: from its first scored position)."
    ),
    base: Optional[str] = typer.Option(None, "--base", help="The base file, if it moved since the compare run."),
    model: Optional[str] = typer.Option(
        None, "-m", "--model", help="Tokenizer source (default: the base file's model, else the compared model)."
    ),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the rows here."),
):
    """Where a quant goes wrong: the positions (or windows) with the largest divergence, with
    their text, the target, both models' top-1 tokens and probabilities."""
    from kldtool.analysis.worst import rank_worst
    from kldtool.report.worst import print_tokens, print_windows
    from kldtool.runtime.small_files import write_json

    from kldtool.analysis.breakdown import BY as SPLITS

    if by in SPLITS:
        from kldtool.analysis.breakdown import breakdown, parse_class
        from kldtool.report.breakdown import breakdown_lines

        out = breakdown(result, by, [parse_class(c) for c in classes], base, model)
        print("\n".join(breakdown_lines(out)))
        if json_out:
            write_json(json_out, out)
        return
    if classes:
        raise UsageError("--class goes with --by kind")
    rows = rank_worst(result, n, by, context, base, model)
    if by == "window":
        print_windows(rows)
    else:
        print_tokens(rows, by)
    if json_out:
        write_json(json_out, {"kind": "kldtool-worst", "result": result, "by": by, "rows": rows})
