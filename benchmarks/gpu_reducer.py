"""GPU: the reducer's throughput on rows of a 128,256-token vocabulary, and its cost beside the
forward pass of an 8B-shaped model, in one run on one device.

For each logits dtype and each reducer (the torch one, and the one-pass Triton kernel that
is the CUDA default), times ``reduce_rows`` as the engines call it (records copied back to
the host included) and reports rows/s and the input bandwidth it reaches: bytes of uint16
base rows + compared logits, each counted once, per second, divided by the device's peak
(its data-sheet HBM figure; a device-to-device copy's measured bandwidth is printed beside).
Both reducers are checked against a float64 reference on the same rows first.

Then builds a Llama-3-8B-shaped model with random bf16 weights on the device, times one
forward of a 2048-token window, and the reduction of that window's 1023 scored rows (the
llama.cpp protocol's second half) against base rows: the KLD's share of the model's time.
The same for a hidden-state base file (``--store hidden``): those rows' base logits replayed on
the device from the final hidden states through the head, encoded into rows as the reader
encodes them, and reduced.

    python benchmarks/gpu_reducer.py [--rows 2048] [--no-forward] [--results FILE]
    python benchmarks/gpu_reducer.py --tiny --results /tmp/r.md   # the same code on the CPU, tiny shapes

``--tiny`` (gpu_check.sh --dry-run, in CI) runs every step on the CPU at toy sizes, float32 only,
the Triton kernel under Triton's interpreter (TRITON_INTERPRET=1 set before anything imports
Triton), so the script cannot rot between the rare sessions that have a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results import append_row  # noqa: E402

from kldtool.codec import encode_torch, row_width  # noqa: E402
from kldtool.codec.encode import encode_device  # noqa: E402
from kldtool.reduce import CLAMPED_AT, reduce_rows  # noqa: E402

# Data-sheet HBM bandwidth, bytes/s; the first name contained in the device name wins.
PEAK = [
    ("H100 80GB HBM3", 3.35e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H200", 4.8e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100-SXM4-40GB", 1.555e12),
    ("A100 80GB PCIe", 1.935e12),
    ("L40S", 0.864e12),
]
LLAMA_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=8192,
    rope_theta=500000.0,
)
# The same architecture at a size a CPU runs in seconds (gpu_check.sh --dry-run).
LLAMA_TINY = dict(
    LLAMA_8B,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=4096,
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


WARM_UPS = 3


def timed_ms(fn, iters: int) -> float:
    """Median wall time of ``fn`` in ms, after warm-up (Triton compiles on the first call)."""
    import time

    for _ in range(WARM_UPS):
        fn()
    times = []
    for _ in range(iters):
        if DEVICE == "cpu":
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def copy_bandwidth() -> float:
    x = torch.empty(1 << (30 if DEVICE == "cuda" else 24), dtype=torch.uint8, device=DEVICE)
    y = torch.empty_like(x)
    return 2 * x.numel() / (timed_ms(lambda: y.copy_(x), 10) / 1e3)


def inputs(n_rows: int, vocab: int, dtype, base_logits=None):
    """(compared logits, int16 base rows, targets): the base is the compared model plus noise."""
    g = torch.Generator(device=DEVICE).manual_seed(0)
    if base_logits is None:
        base_logits = torch.randn(n_rows, vocab, device=DEVICE, generator=g) * 3
    base_logits = base_logits.float()
    rows, _ = encode_torch(base_logits + 0.3 * torch.randn(base_logits.shape, device=DEVICE, generator=g), "grid")
    targets = torch.randint(0, vocab, (n_rows,), device=DEVICE, generator=g)
    return base_logits.to(dtype), rows, targets


def reference_kld(logits, rows, n: int = 64):
    """Float64 KLD of the first ``n`` rows, straight from the definitions."""
    v = logits.shape[1]
    head = rows[:n, :4].contiguous().view(torch.float32).double()
    b = (rows[:n, 4 : 4 + v].int() & 0xFFFF).double() * head[:, :1] + head[:, 1:2]
    logq = torch.log_softmax(logits[:n].double(), dim=1)
    return torch.where(b > CLAMPED_AT, b.exp() * (b - logq), torch.zeros_like(b)).sum(1).cpu().numpy()


def reference_extras(logits, rows, n: int = 64) -> dict:
    """Float64 reverse KLD and JSD of the first ``n`` rows, straight from the definitions."""
    v = logits.shape[1]
    head = rows[:n, :4].contiguous().view(torch.float32).double()
    b = (rows[:n, 4 : 4 + v].int() & 0xFFFF).double() * head[:, :1] + head[:, 1:2]
    logq = torch.log_softmax(logits[:n].double(), dim=1)
    q = logq.exp()
    p = torch.where(b > CLAMPED_AT, b.exp(), torch.zeros_like(b))
    m = (p + q) / 2
    half = lambda a: torch.where(a > 0, a * (a / m).log(), torch.zeros_like(a)).sum(1)  # noqa: E731
    return {"rkld": (q * (logq - b)).sum(1).cpu().numpy(), "jsd": (0.5 * (half(p) + half(q))).cpu().numpy()}


def agreement(logits, rows, targets) -> str:
    """The Triton kernel's records against float64 (reverse KLD, JSD) and the torch reducer's
    (every other record, the top-5/10 sets and top-1 ids included)."""
    ref = reference_extras(logits, rows)
    tri, tor = run_reducer("triton", logits, rows, targets), run_reducer("torch", logits, rows, targets)
    n = len(ref["rkld"])
    same = [
        f for f in ("same_top", "top5", "top10", "top1_q", "top1_base") if (getattr(tri, f) == getattr(tor, f)).all()
    ]
    return (
        f"max |rkld - float64| {abs(tri.rkld[:n] - ref['rkld']).max():.1e}, max |jsd - float64| "
        f"{abs(tri.jsd[:n] - ref['jsd']).max():.1e}, equal to the torch reducer's: {', '.join(same)}"
    )


def unsure_rows(logits, rows, targets) -> str:
    """How many rows the Triton reducer sends the exact way (its per-lane candidates may miss
    one of the top 10), of the compared logits and of the base rows."""
    from kldtool.reduce.triton_kernel import COLUMNS, reduce_rows_triton

    unsure = reduce_rows_triton(logits, rows, targets, CLAMPED_AT)[COLUMNS.index("unsure")].to(torch.int64)
    return f"{int((unsure & 1).sum())} (compared) and {int((unsure & 2).bool().sum())} (base) of {len(logits)}"


def run_reducer(kind: str, logits, rows, targets):
    os.environ["KLDTOOL_REDUCER"] = kind
    return reduce_rows(logits, rows, targets)


SWEEP = (  # (tile, warps, stages) of the reducer's kernel
    (256, 2, 1),
    (512, 4, 1),
    (1024, 4, 1),
    (1024, 4, 2),
    (1024, 8, 1),
    (2048, 4, 1),
    (2048, 8, 1),
    (2048, 16, 1),
    (4096, 16, 1),
)
ENCODER_SWEEP = ((1024, 4), (1024, 8), (2048, 8), (4096, 16))  # (tile, warps) of the row encoder


def sweep(row_counts, vocab: int, iters: int, peak: float) -> None:
    """The kernel alone (no host copies) and the whole records (its candidates' top-10 and the
    copy to the host included) at several tile sizes and warp counts."""
    from kldtool.reduce.triton_kernel import reduce_rows_triton
    from kldtool.reduce.triton_records import triton_records

    for n_rows in row_counts:
        for dtype in (torch.bfloat16, torch.float32) if n_rows == row_counts[0] else (torch.bfloat16,):
            logits, rows, targets = inputs(n_rows, vocab, dtype)
            moved = n_rows * (2 * row_width(vocab) + vocab * logits.element_size())
            for tile, warps, stages in SWEEP:
                config = dict(tile=tile, num_warps=warps, stages=stages)
                ms = timed_ms(lambda: reduce_rows_triton(logits, rows, targets, CLAMPED_AT, **config), iters)
                whole = timed_ms(lambda: triton_records(logits, rows, targets, CLAMPED_AT, **config), iters)
                print(
                    f"  {n_rows} rows {str(dtype):>14} tile {tile:5d} warps {warps:2d} stages {stages}: kernel "
                    f"{ms:6.3f} ms ({100 * moved / (ms / 1e3) / peak:5.1f} % of peak), records {whole:6.3f} ms"
                )


def encoder_sweep(logits, iters: int) -> str:
    """The row encoder (rows_triton.py) at other tiles and warp counts, on the replayed logits."""
    from kldtool.codec import rows_triton

    kept = rows_triton.TILE, rows_triton.NUM_WARPS
    times = []
    try:
        for tile, warps in ENCODER_SWEEP:
            rows_triton.TILE, rows_triton.NUM_WARPS = tile, warps
            times.append(f"tile {tile} warps {warps} {timed_ms(lambda: encode_device(logits, 'grid'), iters):.3f} ms")
    finally:
        rows_triton.TILE, rows_triton.NUM_WARPS = kept
    return "; ".join(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-forward", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="also time the bare kernel at other tile sizes and warps")
    ap.add_argument("--results", default=None, help="RESULTS.md to append to (default: benchmarks/RESULTS.md)")
    ap.add_argument("--tiny", action="store_true", help="toy sizes on any device: checks the script, measures nothing")
    a = ap.parse_args()
    global WARM_UPS
    ctx = 2048
    if a.tiny:
        a.vocab, a.rows, a.iters, ctx, WARM_UPS = LLAMA_TINY["vocab_size"], 32, 1, 64, 1
    elif DEVICE == "cpu":
        raise SystemExit("gpu_reducer.py measures a GPU; this torch sees none (--tiny checks the script on the CPU)")
    shape = LLAMA_TINY if a.tiny else LLAMA_8B
    dtypes = (torch.float32,) if DEVICE == "cpu" else (torch.bfloat16, torch.float32)

    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)"
    peak = next((bw for key, bw in PEAK if key in name), None)
    copy_bw = copy_bandwidth()
    print(
        f"{name}: data-sheet peak {peak / 1e12 if peak else float('nan'):.2f} TB/s, "
        f"measured copy {copy_bw / 1e12:.2f} TB/s"
    )
    peak = peak or copy_bw
    where = f"{name}, torch {torch.__version__}"
    figures, best_fraction = [], 0.0
    for dtype in dtypes:
        logits, rows, targets = inputs(a.rows, a.vocab, dtype)
        moved = a.rows * (2 * row_width(a.vocab) + a.vocab * logits.element_size())
        ref = reference_kld(logits, rows)
        for kind in ("torch", "triton"):
            err = abs(run_reducer(kind, logits, rows, targets).kld[: len(ref)] - ref).max()
            ms = timed_ms(lambda: run_reducer(kind, logits, rows, targets), a.iters)
            bw = moved / (ms / 1e3)
            frac = bw / peak
            if kind == "triton":
                best_fraction = max(best_fraction, frac)
            dt = str(dtype).split(".")[1]
            print(
                f"{dt:>8} logits, {kind:>6}: {ms:7.3f} ms for {a.rows} rows = {a.rows / ms * 1e3:9.0f} rows/s, "
                f"{bw / 1e12:.2f} TB/s = {100 * frac:5.1f} % of peak, {100 * bw / copy_bw:5.1f} % of copy; "
                f"max |KLD - float64| {err:.1e}"
            )
            figures.append(f"{dt} {kind} {a.rows / ms * 1e3:,.0f} rows/s {100 * frac:.0f} % of peak")
        print(f"{dt:>8} logits: {agreement(logits, rows, targets)}")
        del logits, rows, targets
    if a.sweep:
        sweep((a.rows, ctx // 2 - 1), a.vocab, a.iters, peak)
    append_row(
        f"GPU reducer, {a.rows} rows x {a.vocab} vocab (base rows + logits read once)",
        "; ".join(figures),
        f"Triton {best_fraction:.2f} of peak HBM (target >= 0.50)",
        where,
        a.results,
    )

    if a.no_forward:
        return
    from transformers import LlamaConfig, LlamaForCausalLM

    from kldtool.logitsfile.hidden import OutputHead

    torch.set_default_dtype(dtypes[0])
    with torch.device(DEVICE):
        model = LlamaForCausalLM(LlamaConfig(**shape)).eval()
    torch.set_default_dtype(torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, shape["vocab_size"], (1, ctx), device=DEVICE)
    scored = slice(ctx // 2, ctx - 1)  # the llama.cpp protocol's rows of a window
    with torch.inference_mode():
        fwd_ms = timed_ms(lambda: model(ids).logits, 5 if not a.tiny else 1)
        logits = model(ids).logits[0, scored]
        _, rows, targets = inputs(len(logits), shape["vocab_size"], dtypes[0], base_logits=logits)
        shares = []
        print(
            f"rows whose top-10 candidates could miss an entry (topk over the whole row): {unsure_rows(logits, rows, targets)}"
        )
        for kind in ("torch", "triton"):
            ms = timed_ms(lambda: run_reducer(kind, logits, rows, targets), a.iters)
            shares.append((kind, ms))
            print(
                f"Llama-3-shaped forward ({n_params / 1e9:.2f} B params, {dtypes[0]}, {ctx} tokens): {fwd_ms:.1f} ms; "
                f"{kind} reducer on its {len(logits)} scored rows: {ms:.3f} ms = {100 * ms / fwd_ms:.2f} % of the "
                f"forward"
            )
        states = model.model(ids).last_hidden_state[0, scored]
        head = OutputHead(weight=model.lm_head.weight)
        replay_err = (head.apply(states, head.weight, None) - logits.float()).abs().max().item()

        def replay_and_reduce():
            base = encode_device(head.apply(states, head.weight, None), "grid")[0]
            return run_reducer("triton", logits, base, targets)

        replay_ms = timed_ms(replay_and_reduce, a.iters)
        replayed = head.apply(states, head.weight, None)
        parts = {
            "head product": timed_ms(lambda: head.apply(states, head.weight, None), a.iters),
            "encoding (torch)": timed_ms(lambda: encode_torch(replayed, "grid"), a.iters),
            "encoding (as run)": timed_ms(lambda: encode_device(replayed, "grid"), a.iters),
        }
        same = torch.equal(encode_torch(replayed, "grid")[0], encode_device(replayed, "grid")[0])
        if a.sweep:
            print(f"row encoder on the {len(logits)} replayed rows: {encoder_sweep(replayed, a.iters)}")
        print(
            f"hidden-state base: head replay + encoding + triton reducer on the {len(logits)} rows: {replay_ms:.3f} ms = "
            f"{100 * replay_ms / fwd_ms:.2f} % of the forward (replayed logits vs the model's: max |diff| "
            f"{replay_err:.1e}); parts: "
            + ", ".join(f"{k} {ms:.3f} ms" for k, ms in parts.items())
            + f"; encoder's codes equal encode_torch's: {same}"
        )
    append_row(
        f"GPU reducer vs Llama-{'tiny' if a.tiny else '8B'}-shaped forward (random {dtypes[0]} weights, "
        f"{ctx}-token window, {len(logits)} scored rows)",
        f"forward {fwd_ms:.1f} ms; "
        + "; ".join(f"{k} reducer {ms:.2f} ms" for k, ms in shares)
        + f"; hidden-state base: replay + encoding + triton reducer {replay_ms:.2f} ms ("
        + ", ".join(f"{k} {ms:.2f}" for k, ms in parts.items())
        + ")",
        f"Triton KLD = {shares[1][1] / fwd_ms:.4f} of the forward (target < 0.05); with the replay "
        f"{replay_ms / fwd_ms:.4f} (target < 0.05)",
        where,
        a.results,
    )


if __name__ == "__main__":
    main()
