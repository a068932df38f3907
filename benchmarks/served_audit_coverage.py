"""How honest is `compare --generated`'s interval on a real server? (issue 83)

A stock vLLM server (no kldtool plugin) of the W8A8 checkpoint samples R answers to each of P
built-in chat prompts through its chat API, each answer with its own seed: R independent audits
of P answers (audit j holds every prompt's answer j). Each audit's estimate of KL(served‖base)
and its 95 % bootstrap interval are set against the exact reverse KLD over the same tokens, from
W8A8's full rows (offline vLLM over the same corpus) and the base's (the float32 model through
transformers), in float64. Prints the coverage of the intervals and of ±1.96 standard errors,
and appends a row to benchmarks/RESULTS.md. The offline rows are batched otherwise than the
server's, so "exact" carries W8A8's batch noise (small beside the sampling error).

    .venv/bin/python benchmarks/served_audit_coverage.py [--runs 100] [--prompts 8] [--tokens 32] [--dir D]

``--dir D`` keeps the corpus and the two base files there; a second run over the same D reuses
what is already made.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def kldtool(*args) -> None:
    subprocess.run([sys.executable, "-m", "kldtool", *map(str, args), "--progress", "none"], check=True, cwd=ROOT)


def rows_of(path: Path) -> list[np.ndarray]:
    """Each window's scored rows of a base file, float64 log-probs."""
    from kldtool.codec.rows import decode_np
    from kldtool.logitsfile import open_base_file
    from kldtool.text.protocols import stored_windows

    reader = open_base_file(path)
    try:
        windows = stored_windows(reader.tokens, reader.header, None)
        return [decode_np(reader.read_rows(w.index, 0, w.n_scored), reader.header.n_vocab).astype(np.float64)
                for w in windows]  # fmt: skip
    finally:
        reader.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--dir", help="keep (and reuse) the corpus and base files here")
    a = p.parse_args()

    from helpers.vllm_serve import served
    from results import append_row

    from kldtool.engines.defaults import cache_dir, default_transformers_model
    from kldtool.stats.bootstrap import Bootstrap
    from kldtool.stats.served_kl import Sample, reverse_kld
    from kldtool.text.generated import read_generated

    fp32, w8a8 = default_transformers_model(), cache_dir() / "SmolLM2-135M-Instruct-W8A8"
    if not (w8a8 / "config.json").exists():
        sys.exit(f"{w8a8}: not built; the tests build it (tests/conftest.py's w8a8_dir)")
    d = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="audit-coverage-"))
    d.mkdir(parents=True, exist_ok=True)
    corpus, window = d / "served.jsonl", 64 + a.tokens + 1
    if not corpus.exists():
        with served(str(w8a8), d, window) as url:
            kldtool("generate", "--endpoint", url, "-m", fp32, "--num-prompts", a.prompts, "-n", a.runs,
                    "--max-tokens", a.tokens, "--concurrency", 32, "-o", corpus)  # fmt: skip
    if not (d / "p.kldt").exists():
        kldtool("base", "--engine", "transformers", "-m", fp32, "-f", corpus, "--kl-divergence-base", d / "p.kldt")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not (d / "q.kldt").exists():  # vLLM's window given: a generated corpus sets none (8,192 + 1 by default)
        kldtool("base", "--engine", "vllm", "-m", w8a8, "--vllm-arg", f"max_model_len={window}", "-f", corpus,
                "--kl-divergence-base", d / "q.kldt")  # fmt: skip
    _, samples = read_generated(str(corpus))
    lp_rows, lq_rows = rows_of(d / "p.kldt"), rows_of(d / "q.kldt")
    by_run: dict[int, list] = {}
    for s, lp, lq in zip((s for s in samples if len(s["ids"])), lp_rows, lq_rows):
        n, x = len(lp), s["ids"][: len(lp)]
        at = np.arange(n)
        sample = Sample(served=s["served"]["logprobs"][:n], base=lp[at, x], clamped=np.zeros(n, bool),
                        top=np.zeros((n, 1)), rank=np.full(n, -1))  # fmt: skip
        exact = np.sum(np.exp(lq) * (lq - lp), axis=1)
        by_run.setdefault(s["sample"], []).append((sample, exact))
    held = {"interval_95": 0, "bootstrap_95": 0}
    errors = []
    for j, parts in sorted(by_run.items()):
        r = reverse_kld([x for x, _ in parts], Bootstrap(400, j))
        exact = float(np.concatenate([e for _, e in parts]).mean())
        for key in held:
            held[key] += r[key][0] <= exact <= r[key][1]
        errors.append((r["value"] - exact) / r["standard_error"])
    n, t, boot = len(by_run), held["interval_95"], held["bootstrap_95"]
    print(f"{n} audits of {a.prompts} answers of <= {a.tokens} tokens from a stock vLLM server of W8A8")
    print(f"the t 95 % interval holds the exact KL(served‖base): {t}/{n}; the bootstrap's: {boot}/{n}")
    print(f"(estimate - exact) / s.e.: mean {np.mean(errors):+.3f}, s.d. {np.std(errors, ddof=1):.3f}")
    append_row(
        f"compare --generated interval coverage (W8A8 on stock vLLM, {n} audits x {a.prompts} answers x {a.tokens})",
        f"t 95 %: {t}/{n}; bootstrap 95 %: {boot}/{n}; z mean {np.mean(errors):+.3f}, s.d. {np.std(errors, ddof=1):.3f}",
        f"coverage {t / n:.3f}",
    )


if __name__ == "__main__":
    main()
