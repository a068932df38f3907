"""``report``'s table of served models audited against one base (analysis/served_runs.py):
closest first, each with its KL(served‖base), interval, whether the server sampled as asked and
whether it counted the prompts as rendered here; ``diff``'s lines for two of them."""

from __future__ import annotations

from kldtool.analysis.served_runs import is_audit, ranked, read_audits
from kldtool.report.table import console_table, markdown_lines

HEAD = ["provider", "KL(served‖base)", "±", "95 % interval", "KLD ≥", "tokens", "samples", "sampling", "prompts"]
TITLE = "Served models against one base, from their own samples"


def rows(audits: list[dict]) -> list[list[str]]:
    out = []
    for r in audits:
        k, c, p = r["reverse_kld"], r["sampling_check"], r["prompt_tokens"]
        lo, hi = k["interval_95"] or (None, None)
        check = (
            "not checked" if c["passes"] is None else ("passes" if c["passes"] else f"FAILS (|z| {c['max_abs_z']:.1f})")
        )
        counted = "not counted" if not p["counted_by_server"] else (
            "as rendered" if not p["differ"] else f"{p['differ']}/{p['counted_by_server']} differ"
        )  # fmt: skip
        out.append(
            [
                r["label"],
                f"{k['value']:.6f}",
                f"{k['standard_error']:.6f}" if k["standard_error"] is not None else "",
                f"[{lo:.6f}, {hi:.6f}]" if lo is not None else "",
                f"{r['bounds']['kld_at_least']:.6f}",  # the forward KLD's lower bound from the top K
                str(k["tokens"]),
                str(k["samples"]),
                check,
                counted,
            ]
        )
    return out


def console(audits: list[dict]) -> None:
    console_table(HEAD, rows(audits), TITLE)


def markdown(audits: list[dict]) -> str:
    return "\n".join([f"## {TITLE}", "", *markdown_lines(HEAD, rows(audits))]) + "\n"


def diff_lines(d: dict) -> list[str]:
    lo, hi = d["interval_95"]
    sig = "significant" if d["significant"] else "not significant"
    return [
        f"A: {d['a']['label']}: KL(served‖base) {d['a']['value']:.6f}",
        f"B: {d['b']['label']}: KL(served‖base) {d['b']['value']:.6f}",
        f"A − B = {d['difference']:+.6f}, 95 % [{lo:+.6f}, {hi:+.6f}] over {d['prompts']} prompts answered by both "
        f"({sig}; A lower on {d['a_lower']} of them)",
    ]


def report_audits(paths: list[str], markdown_path: str | None) -> bool:
    """``report`` of audits (compare --generated results) only: the table, closest to the base
    first, and its Markdown; False where ``paths`` hold none (another report's)."""
    from kldtool.report.kinds import all_of_kind

    if not all_of_kind(paths, is_audit, "a compare --generated result"):
        return False
    rows = ranked(read_audits(paths))
    console(rows)
    if markdown_path:
        from kldtool.runtime.small_files import write_text

        write_text(markdown_path, markdown(rows))
    return True
