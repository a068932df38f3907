"""What a server's top-K log-probs tell of the KLD (issue 65): for llama.cpp requants of the
built-in model against the Q4_1 base file, the full-row mean KLD beside the endpoint
reducer's lower bound and tail estimate at several K, the base's mass outside the top K, and
whether the bound and the estimate rank the quants as the full KLD does.

The compared model's top-K ids, their log-probs and the target's are what an
OpenAI-compatible server returns; here they are taken from the quant's own full logits
(llama.cpp through kldtool's engine), so the same logits give the full records and the
bounded ones. The reducers are kldtool's (reduce/quant_topk.py against the numba full-row
reducer); the servers themselves are exercised by tests/test_endpoint.py.

    .venv/bin/python benchmarks/endpoint_bounds.py [--ctx 512] [--chunks 8] [--ks 1,5,20,64]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from base_fixture import ROOT, WIKI, kldtool
from results import append_row

CACHE = Path(os.environ.get("KLDTOOL_BENCH_DIR", Path.home() / ".cache" / "kldtool" / "endpoint"))


def _top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, log-probs) of each row's k most probable entries, and all log-probs (float64)."""
    x = logits.astype(np.float64)
    logq = x - x.max(1, keepdims=True)
    logq -= np.log(np.exp(logq).sum(1, keepdims=True))
    ids = np.argsort(-logq, axis=1, kind="stable")[:, :k]
    return ids, np.take_along_axis(logq, ids, 1), logq


def measure(quant: Path, base: Path, ks: list[int]) -> dict:
    from kldtool.engines import EngineOptions, make_engine
    from kldtool.logitsfile import open_base_file
    from kldtool.pipeline import engine_modes
    from kldtool.pipeline.compat import base_windows
    from kldtool.reduce import reduce_base
    from kldtool.reduce.quant_topk import reduce_quant_topk

    reader = open_base_file(base)
    h = reader.header
    engine = make_engine(EngineOptions(engine="llamacpp", model=str(quant)), h.n_ctx)
    windows = base_windows(reader, engine.bos_id)
    full, bound = [], {k: [] for k in ks}
    source = engine_modes.rows_source(engine, reader, [w.index for w in windows])
    for w in windows:
        (lg,) = engine.logits([w])
        rows = np.concatenate(list(source.parts_numpy(w.index, 0, w.n_scored)))
        full.append(reduce_base(lg, rows, w.targets, h))
        for k in ks:
            ids, lps, logq = _top_k(lg, k)
            target = logq[np.arange(len(lg)), w.targets]
            bound[k].append(reduce_quant_topk(rows, h.n_vocab, h.clamped_at, ids, lps, target, w.targets))
    engine.close()
    kld = np.concatenate([r.kld for r in full])
    out = {"kld": float(kld.mean()), "n": len(kld)}
    for k in ks:
        low = np.concatenate([r.kld for r in bound[k]])
        tail = np.concatenate([r.kld_tail for r in bound[k]])
        p_out = np.concatenate([r.p_out for r in bound[k]])
        # the full reducer's float32 terms against the bound's float64 ones: the excess, if any, is rounding
        out[k] = {"bound": float(low.mean()), "estimate": float((low + tail).mean()), "p_out": float(p_out.mean())}
        out[k]["excess"] = float((low - kld).max())
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--ks", default="1,5,20,64")
    ap.add_argument("--types", default="Q2_K,Q3_K_M,Q4_K_M,Q6_K,Q8_0")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from kldtool.engines.defaults import default_gguf

    ks = [int(k) for k in a.ks.split(",")]
    CACHE.mkdir(parents=True, exist_ok=True)
    src = default_gguf()
    base = CACHE / f"base-c{a.ctx}-{a.chunks}.kld"
    if not base.exists():
        kldtool("base", "-m", src, "-f", WIKI, "-c", a.ctx, "--chunks", a.chunks, "--kl-divergence-base", base)
    got = {}
    for t in a.types.split(","):
        quant = CACHE / f"{t}.gguf"
        if not quant.exists():
            kldtool("quantize", src, quant, t)
        got[t] = measure(quant, base, ks)
    n = next(iter(got.values()))["n"]
    print(f"{n} positions, -c {a.ctx}; mean KLD: full, then bound / estimate (P_out) at each K")
    print(f"{'quant':8} {'full':>9}  " + "  ".join(f"{'K=' + str(k):>26}" for k in ks))
    for t, g in got.items():
        cells = [f"{g[k]['bound']:.5f} / {g[k]['estimate']:.5f} ({g[k]['p_out']:.3f})" for k in ks]
        print(f"{t:8} {g['kld']:9.5f}  " + "  ".join(f"{c:>26}" for c in cells))
    order = sorted(got, key=lambda t: got[t]["kld"])
    same = {}
    for k in ks:
        for what in ("bound", "estimate"):
            same[(k, what)] = sorted(got, key=lambda t, k=k, w=what: got[t][k][w]) == order
    print("ranking by full KLD:", " < ".join(order))
    print("same ranking:", ", ".join(f"K={k} {w}: {'yes' if ok else 'no'}" for (k, w), ok in same.items()))
    excess = max(g[k]["excess"] for g in got.values() for k in ks)
    print(f"largest bound - full KLD at any position: {excess:.2e} (float32 rounding of the full reducer)")
    ratio = {k: np.mean([got[t][k]["bound"] / got[t]["kld"] for t in got]) for k in ks}
    est = {k: np.mean([got[t][k]["estimate"] / got[t]["kld"] for t in got]) for k in ks}
    summary = ", ".join(f"K={k}: bound {ratio[k]:.2f}, estimate {est[k]:.2f} of full" for k in ks)
    print(summary)
    append_row(
        "endpoint_bounds",
        f"{len(got)} requants of SmolLM2 Q4_1 against its base, {n} positions at -c {a.ctx}, mean over quants: "
        f"{summary}; the full KLD's ranking kept by {sum(same.values())} of {len(same)} (K, bound/estimate)",
        f"bound / full KLD at K={ks[-1]}: {ratio[ks[-1]]:.2f}",
    )


if __name__ == "__main__":
    main()
