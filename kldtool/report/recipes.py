"""``report`` of ``recipe`` results (analysis/recipe_runs.py): a table of the recipes (target,
size, predicted and measured KLD on the cost windows, the additive prediction's error, the
held-out KLD), the proof's paired rows against llama.cpp's mixes, and in HTML the frontier
plot (report/frontier_plot.py) with every round's prediction beside its measurement."""

from __future__ import annotations

import html
import os
import tempfile

from kldtool.analysis.recipe_runs import is_recipe, read_recipes
from kldtool.report.table import console_table, markdown_lines

HEAD = ["recipe", "target", "bytes", "predicted KLD", "measured KLD", "additive error", "rounds", "held-out KLD",
        "routing flips"]  # fmt: skip
PROOF_HEAD = ["recipe", "mix", "mix bytes", "mix KLD", "recipe KLD", "recipe − mix", "95 % interval", "the recipe is"]
ROUND_HEAD = ["recipe", "round", "bytes", "predicted", "additive", "measured", "apart"]
TITLE = "Recipes: per-tensor types chosen from measured costs"


def _target(r: dict) -> str:
    t = r["target"]
    return f"≤ {int(t['value']):,} bytes" if t["kind"] == "size" else f"KLD ≤ {t['value']:g}"


def rows(recipes: list[dict]) -> list[list[str]]:
    out = []
    for r in recipes:
        proof = r.get("proof")
        err = abs(r["rounds"][-1]["uncorrected"] - r["measured_kld"]) / r["measured_kld"] if r["measured_kld"] else 0
        out.append([r["label"], _target(r), f"{r['size']:,}", f"{r['predicted_kld']:.6f}",
                    f"{r['measured_kld']:.6f}", f"{100 * err:.1f} %", str(len(r["rounds"])),
                    f"{proof['recipe']['kld']:.6f}" if proof else "-",
                    f"{100 * r['routing_flips']['decisions']:.2f} %" if r.get("routing_flips") else "-"])  # fmt: skip
    return out


def proof_rows(recipes: list[dict]) -> list[list[str]]:
    out = []
    for r in recipes:
        proof = r.get("proof")
        for m in proof["mixes"] if proof else ():
            lo, hi = m["interval_95"]
            out.append([r["label"], m["mix"], f"{m['bytes']:,}", f"{m['kld']:.6f}", f"{proof['recipe']['kld']:.6f}",
                        f"{m['recipe_minus_mix']:+.6f}", f"[{lo:+.6f}, {hi:+.6f}]", m["recipe_is"]])  # fmt: skip
    return out


def round_rows(recipes: list[dict]) -> list[list[str]]:
    return [
        [
            r["label"],
            str(k + 1),
            f"{q['size']:,}",
            f"{q['predicted']:.6f}",
            f"{q['uncorrected']:.6f}",
            f"{q['measured']:.6f}",
            f"{100 * abs(q['predicted'] - q['measured']) / q['measured']:.1f} %" if q["measured"] else "-",
        ]  # fmt: skip
        for r in recipes
        for k, q in enumerate(r["rounds"])
    ]


def _windows(recipes: list[dict]) -> str:
    r = recipes[0]
    cost = r["cost_windows"]
    proof = next((x["proof"] for x in recipes if x.get("proof")), None)
    held = f"; proof on held-out windows {proof['windows'][0]}-{proof['windows'][1]} (llama.cpp)" if proof else ""
    return f"source {r['source']}; base file {r['base_file']}; costs on windows {cost[0]}-{cost[-1]}{held}"


def console(recipes: list[dict]) -> None:
    console_table(HEAD, rows(recipes), TITLE)
    if proved := proof_rows(recipes):
        console_table(PROOF_HEAD, proved, "Proof on the held-out windows, paired with each mix", left=2)
    print(_windows(recipes))


def markdown(recipes: list[dict]) -> str:
    lines = [f"## {TITLE}", "", _windows(recipes), "", *markdown_lines(HEAD, rows(recipes))]
    if proved := proof_rows(recipes):
        lines += ["", "### Proof on the held-out windows", "", *markdown_lines(PROOF_HEAD, proved, 2)]
    return "\n".join(lines) + "\n"


def html_page(recipes: list[dict], title: str | None) -> str:
    from kldtool.report.frontier_plot import draw
    from kldtool.report.html import image, page, table_html

    mixes = [m for r in recipes for m in r["mixes_on_cost_windows"]]
    with tempfile.TemporaryDirectory() as d:
        png = os.path.join(d, "frontier.png")
        draw([{**r, "label": r["label"] if len(recipes) > 1 else None} for r in recipes], mixes, png)
        figure = image(png, "size against mean KLD: predicted frontier, built recipes, llama.cpp's mixes")
    body = [f"<p>{html.escape(_windows(recipes))}</p>", table_html(HEAD, rows(recipes), "recipes"),
            "<h2>Frontier</h2>", figure, "<h2>Rounds: predicted against measured</h2>",
            table_html(ROUND_HEAD, round_rows(recipes), "rounds")]  # fmt: skip
    if proved := proof_rows(recipes):
        body += ["<h2>Proof on the held-out windows</h2>", table_html(PROOF_HEAD, proved, "proof")]
    return page(title or TITLE, body)


def report_recipes(paths: list[str], markdown_path: str | None, html_path: str | None, title: str | None) -> bool:
    """``report`` of recipe results only; False where ``paths`` hold none."""
    from kldtool.runtime.small_files import write_text

    from kldtool.report.kinds import all_of_kind

    if not all_of_kind(paths, is_recipe, "a recipe result"):
        return False
    recipes = read_recipes(paths)
    console(recipes)
    if markdown_path:
        write_text(markdown_path, markdown(recipes))
    if html_path:
        write_text(html_path, html_page(recipes, title))
    return True
