"""Quants measured on the model's own text (issue 82): SmolLM2-135M-Instruct's fp32 form answers
the built-in prompts (``kldtool generate``), the fp32 model (transformers) scores its answers
(``base``), and each quant is compared against that base file, beside the same quants on the
pydoc text (the built-in corpus). Then each quant answers the same prompts itself, the fp32
model scores the quant's answers, and the quant is compared on its own text: KL(base‖quant)
where the quant's failures show, beside its degeneration figures and the base's.

Prints one line per quant and the depth table of the worst one; appends a dated row to
benchmarks/RESULTS.md. The GGUFs are the built-in Q4_1 requantized with llama-cpp-python (its
F32 form is "the base"); generations run through llama.cpp.

    .venv/bin/python benchmarks/own_text.py [--prompts 64] [--max-tokens 256] [--types Q8_0,Q4_K_M,Q3_K_M,Q2_K]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from base_fixture import ROOT, kldtool
from results import append_row

CACHE = Path(os.environ.get("KLDTOOL_BENCH_DIR", Path.home() / ".cache" / "kldtool" / "own-text"))


def compare(quant: Path, base: Path, out: Path, *extra) -> dict:
    if not out.exists():
        kldtool("compare", "-m", quant, "--kl-divergence-base", base, "--json", out, *extra)
    return json.loads(out.read_text())["statistics"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--types", default="Q8_0,Q4_K_M,Q3_K_M,Q2_K")
    ap.add_argument("--pydoc-chunks", type=int, default=20)
    ap.add_argument("--plot", default=str(Path(__file__).resolve().parent.parent / "docs" / "img" / "own_text.png"))
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from kldtool.engines.defaults import default_gguf, default_transformers_model

    CACHE.mkdir(parents=True, exist_ok=True)
    src, fp32 = default_gguf(), default_transformers_model()
    tag = f"p{a.prompts}-t{a.max_tokens}"
    gguf = {"F32": CACHE / "F32.gguf", **{t: CACHE / f"{t}.gguf" for t in a.types.split(",")}}
    for name, path in gguf.items():
        if not path.exists():
            kldtool("quantize", src, path, name)
    gen = ("--num-prompts", a.prompts, "--max-tokens", a.max_tokens, "--seed", 0)
    scored = ("base", "--engine", "transformers", "-m", fp32)
    corpus, bases, figures = {}, {}, {}
    for name, path in gguf.items():  # each model's own answers, scored by the fp32 model
        corpus[name] = CACHE / f"{name}-{tag}.jsonl"
        if not corpus[name].exists():
            kldtool("generate", "-m", path, "-o", corpus[name], *gen, "--json", CACHE / f"{name}-{tag}-gen.json")
        figures[name] = json.loads((CACHE / f"{name}-{tag}-gen.json").read_text())["degeneration"]
        bases[name] = CACHE / f"{name}-{tag}.kldt"
        if not bases[name].exists():
            kldtool(*scored, "-f", corpus[name], "--kl-divergence-base", bases[name])
    pydoc = CACHE / f"pydoc-c512-{a.pydoc_chunks}.kldt"
    if not pydoc.exists():
        kldtool(*scored, "-c", 512, "--chunks", a.pydoc_chunks, "--kl-divergence-base", pydoc)

    def kld(stats: dict) -> str:
        if "bootstrap" not in stats:  # under 100 tokens: no interval (a run too small to measure)
            return f"{stats['kld_mean']['value']:.5f}"
        lo, hi = stats["bootstrap"]["kld_mean"]["interval_95"]
        return f"{stats['kld_mean']['value']:.5f} [{lo:.5f}, {hi:.5f}]"

    f = figures["F32"]
    print(
        f"base (F32) answers: at limit {100 * f['at_limit']:.0f} %, distinct-2 {f['distinct_2']:.3f}, rep4 {100 * f['repeated_4gram']:.1f} %"
    )
    rows, ratios = [], {}
    for t in a.types.split(","):
        on_base = compare(gguf[t], bases["F32"], CACHE / f"{t}-on-base-{tag}.json", "--depth-bins", "1,16,64,128")
        on_pydoc = compare(gguf[t], pydoc, CACHE / f"{t}-on-pydoc-{a.pydoc_chunks}.json")
        on_own = compare(gguf[t], bases[t], CACHE / f"{t}-on-own-{tag}.json")
        g = figures[t]
        line = (
            f"{t}: KLD on the base's answers {kld(on_base)}, on pydoc {kld(on_pydoc)}, on its own answers "
            f"{kld(on_own)}; own answers at limit {100 * g['at_limit']:.0f} %, distinct-2 {g['distinct_2']:.3f}, "
            f"rep4 {100 * g['repeated_4gram']:.1f} %"
        )
        print(line)
        rows.append(line)
        ratios[t] = on_base["kld_mean"]["value"] / on_pydoc["kld_mean"]["value"]
    plot(a.plot, a.types.split(","), tag, a.pydoc_chunks)
    side = CACHE / f"degeneration-{tag}.md"  # report's side-by-side table of the corpora
    kldtool("report", *corpus.values(), "--markdown", side)
    print(side.read_text())
    stats = on_base  # the last (smallest) quant's
    print(f"{t} on the base's answers, by depth from the answer's start:")
    for r in stats.get("depth", {}).get("rows", []):
        print(f"  {r['bucket']:<10} {r['tokens']:>7d} tokens  mean KLD {r['kld_mean']:.5f}")
    by_finish = "; ".join(f"{k} {v['kld_mean']:.5f}" for k, v in stats.get("by_finish", {}).items())
    append_row(
        f"own_text (SmolLM2 F32 base, {a.prompts} built-in prompts x {a.max_tokens} tokens, T=1, seed 0; "
        f"pydoc c512 x {a.pydoc_chunks})",
        "; ".join(rows) + f"; base answers at limit {100 * f['at_limit']:.0f} %, distinct-2 {f['distinct_2']:.3f}, "
        f"rep4 {100 * f['repeated_4gram']:.1f} %; {t} by finish: {by_finish}",
        "KLD on the base's answers / on pydoc: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()),
    )


def plot(path: str, types: list[str], tag: str, pydoc_chunks: int) -> None:
    """Left: each quant's mean KLD (95 % interval) on the base's answers, on pydoc and on its own
    answers; right: its KLD by depth from the answer's start, on the base's answers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    texts = (
        ("the base's answers", "on-base-" + tag),
        ("pydoc", f"on-pydoc-{pydoc_chunks}"),
        ("own answers", "on-own-" + tag),
    )
    width = 0.8 / len(texts)
    for k, (label, suffix) in enumerate(texts):
        means, errs = [], [[], []]
        for t in types:
            st = json.loads((CACHE / f"{t}-{suffix}.json").read_text())["statistics"]
            m = st["kld_mean"]["value"]
            lo, hi = st.get("bootstrap", {}).get("kld_mean", {}).get("interval_95", (m, m))
            means.append(m)
            errs[0].append(m - lo)
            errs[1].append(hi - m)
        ax[0].bar([i + (k - 1) * width for i in range(len(types))], means, width, yerr=errs, capsize=3, label=label)
    ax[0].set(xticks=range(len(types)), xticklabels=types, yscale="log", ylabel="mean KLD", title="KLD by text")
    for t in types:
        rows = (
            json.loads((CACHE / f"{t}-on-base-{tag}.json").read_text())["statistics"].get("depth", {}).get("rows", [])
        )
        x = [(r["depths"][0] + r["depths"][1]) / 2 for r in rows]
        ax[1].plot(x, [r["kld_mean"] for r in rows], "o-", label=t)
    depth = "position in the answer (bucket middle)"
    ax[1].set(xscale="log", yscale="log", xlabel=depth, ylabel="mean KLD", title="on the base's answers, by depth")
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle(f"SmolLM2-135M quants against its F32 form, built-in prompts ({tag}; benchmarks/own_text.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
