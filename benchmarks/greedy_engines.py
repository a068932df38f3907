"""Greedy answers of the built-in model's fp32 form through vLLM (offline) and through
transformers (issue 82): ``kldtool generate --temperature 0`` through vLLM, transformers'
``generate`` of the same prompt ids, then where the two answers to a prompt part, the first parting with both engines' two most likely next tokens
(tests/helpers/greedy_ties.py; vLLM's from its own sampler's log-probs, transformers' from a
float32 forward). Every parting should be a near-tie (top-2 gap under 1e-3 in both).

Prints each parting and a summary; appends a dated row to benchmarks/RESULTS.md; the ratio is
the share of answers identical token for token.

    .venv/bin/python benchmarks/greedy_engines.py [--prompts 64] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from base_fixture import ROOT, kldtool
from results import append_row

NEAR_TIE = 1e-3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    from helpers.greedy_ties import ties

    from kldtool.engines.defaults import default_transformers_model
    from kldtool.engines.vllm.offline import VllmEngine

    fp32 = default_transformers_model()
    size = ("--num-prompts", a.prompts, "--max-tokens", a.max_tokens, "--temperature", 0)
    with tempfile.TemporaryDirectory() as tmp:
        ours = Path(tmp) / "vllm.jsonl"
        kldtool("generate", "--engine", "vllm", "-m", fp32, "--dtype", "float32", *size, "-o", ours)
        engine = VllmEngine(fp32, dtype="float32")
        try:
            r = ties(engine.llm, fp32, ours)
        finally:
            engine.close()
    near = 0
    for p in r["partings"]:
        tie = p["vllm_gap"] < NEAR_TIE and p["transformers_gap"] < NEAR_TIE
        near += tie
        print(
            f"answer {p['sample']} parts at token {p['at']}: vLLM chose {p['vllm_chose']}, transformers "
            f"{p['transformers_chose']}; vLLM's top two {p['vllm_top2']}, transformers' {p['transformers_top2']}"
            f" ({'a near-tie' if tie else 'NOT a near-tie'})"
        )
    same = r["samples"] - len(r["partings"])
    append_row(
        f"greedy_engines (SmolLM2 fp32, vLLM {engine.facts.versions['vllm']} offline vs transformers, "
        f"{a.prompts} built-in prompts x {a.max_tokens} tokens, T=0)",
        f"{same} of {r['samples']} answers identical ({r['tokens']} tokens through vLLM); "
        f"{len(r['partings'])} part, {near} of them at a near-tie (top-2 gap < {NEAR_TIE:g} in both engines)",
        f"identical answers {same / r['samples']:.3f}",
    )


if __name__ == "__main__":
    main()
