"""Cost of kldtool's compare on top of the transformers engine's bare scoring of the same tokens.

One transformers engine, loaded once, scores the windows of a base file it wrote itself twice
per round, in alternating order: (a) bare: the forward pass in kldtool's batches, log_softmax
in float32 and the target's log-prob gathered and copied to the host (what a perplexity
script does); (b) kldtool's whole compare pipeline (base rows read and decoded, the reducer,
accumulators, printing). Loading is excluded from both. Prints the best time of each and their
ratio, the base phase's time and bytes, and appends a dated row to benchmarks/RESULTS.md.

On a CPU it runs the built-in SmolLM2 (fp32); on a GPU, ``--random-llama-8b`` builds a
Llama-3-8B-shaped model with random bf16 weights on the device (any tokenizer directory whose ids
fit, e.g. SmolLM2's, given by --tokenizer), so nothing is downloaded or written to disk.
``--tiny`` builds the same architecture at toy size on the CPU (gpu_check.sh --dry-run).

With ``--hidden`` it also writes a hidden-state base file (``--store hidden``) and times compare
against it, the base logits replayed from the hidden states on the engine's device. It always
times the base-row feed alone (every frame of the container read, decompressed and made into
rows on the device, nothing computed): where that takes longer than the bare forward, the
device waits for the host.

    .venv/bin/python benchmarks/transformers_overhead.py [--ctx 512] [--chunks 16] [--rounds 2]
    python benchmarks/transformers_overhead.py --device cuda --dtype bfloat16 --ctx 2048 \\
        --random-llama-8b --tokenizer TOKDIR --hidden
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results import append_row, machine  # noqa: E402
from timing import best_alternating  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wikitext-2" / "wiki.test.txt"
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


# The same architecture at a size a CPU runs in seconds, with the 8B's vocabulary.
LLAMA_TINY = dict(
    LLAMA_8B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)


def random_llama(shape: dict, tokenizer_dir: str, device: str, dtype: str, batch: int):
    """A transformers engine over a Llama-3-shaped model with random weights made on ``device``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from kldtool.engines.transformers.engine import TransformersEngine

    torch.set_default_dtype(getattr(torch, dtype))
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**shape))
    torch.set_default_dtype(torch.float32)
    return TransformersEngine.from_model(
        model, AutoTokenizer.from_pretrained(tokenizer_dir), "random-llama-3", device=device, batch_tokens=batch
    )


def bare_scoring(engine, windows, device: str) -> None:
    """What a perplexity script does with the same engine: the forward in kldtool's batches,
    log_softmax in float32 and the targets' log-probs gathered and brought to the host."""
    import numpy as np
    import torch

    per_call = engine.windows_per_call(len(windows[0].tokens))
    for i in range(0, len(windows), per_call):
        batch = windows[i : i + per_call]
        ids = torch.from_numpy(np.stack([w.tokens for w in batch]).astype("int64")).to(device)
        first, n = batch[0].first, batch[0].n_scored
        with torch.inference_mode():
            lg = engine.model(input_ids=ids, logits_to_keep=ids.shape[1] - first, use_cache=False).logits
            logp = torch.log_softmax(lg[:, :n].float(), dim=-1)
            tgt = torch.as_tensor(np.stack([w.targets for w in batch]), device=device)
            logp.gather(2, tgt[:, :, None]).cpu()


def numbers(d, prefix="") -> dict:
    """The numbers of a nested statistics dict, by their path."""
    out = {}
    for k, v in d.items() if isinstance(d, dict) else enumerate(d):
        if isinstance(v, (dict, list)):
            out |= numbers(v, f"{prefix}{k}.")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = float(v)
    return out


HEADLINE = (
    "ppl_q.value",
    "ppl_base.value",
    "kld_mean.value",
    "same_top_p.value",
    "rms_dp.value",
    "extra.rkld_mean.value",
    "extra.jsd_mean.value",
    "extra.top_k_agreement.5.value",
    "extra.top_k_agreement.10.value",
)


def agreement(a: dict, b: dict) -> str:
    """Two runs' headline statistics (PPL, mean KLD, same top, RMS Δp) and top-5/10 overlaps,
    side by side where they differ."""
    na, nb = numbers(a), numbers(b)
    keys = [k for k in HEADLINE if k in na and k in nb]
    differ = [f"{k} {na[k]:.9g} vs {nb[k]:.9g}" for k in keys if na[k] != nb.get(k)]
    return f"{len(keys)} headline numbers, " + ("all equal" if not differ else "; ".join(differ))


def host_decode(reader) -> None:
    """The feed's host half alone: every frame read, decompressed, checked and pinned on the
    threads compare's feed would use, nothing sent to a device (pinned only where there is one)."""
    import torch

    from kldtool.logitsfile.prefetch import prefetch_plan, submitted
    from kldtool.logitsfile.reader_base import stage_frame

    stage = stage_frame if torch.cuda.is_available() else (lambda frame: frame)
    ahead, threads = prefetch_plan(reader.frame_nbytes)
    frames = range(reader.frames.n_frames)
    for _, fut in submitted(frames, ahead, threads, lambda k: stage(reader.read_frame(k))):
        fut.result()


def device_profile(fn, sync) -> None:
    """Where the device's time goes in one ``fn()``: its kernels by total time, and how much of
    the wall time the device was busy at all (the rest it waited for the host)."""
    import time

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        fn()
        sync()
        wall = time.perf_counter() - t0
    from torch.autograd import DeviceType

    events = prof.key_averages()
    # Kernels on the side streams overlap the compute stream's: the sum may pass the wall time.
    busy = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e6
    print(f"device profile of one compare: {wall:.3f} s wall (profiled), kernels {busy:.3f} s in all")
    print(events.table(sort_by="self_device_time_total", row_limit=22, max_name_column_width=70))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: the built-in fp32 SmolLM2)")
    ap.add_argument("--random-llama-8b", action="store_true", help="a Llama-3-8B shape with random weights")
    ap.add_argument("--tiny", action="store_true", help="the same shape at toy size (checks the script)")
    ap.add_argument(
        "--layers", type=int, default=None, help="--random-llama-8b with this many of its 32 layers (a CPU's memory)"
    )
    ap.add_argument("--vocab", type=int, default=None, help="--random-llama-8b with this vocabulary instead of 128,256")
    ap.add_argument("--tokenizer", default=None, help="tokenizer directory for --random-llama-8b (default: SmolLM2's)")
    ap.add_argument("--hidden", action="store_true", help="also compare against a hidden-state base file")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--batch", type=int, default=2048, help="tokens per forward (kldtool's -b)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--text", default=str(WIKI))
    ap.add_argument("--results", default=None)
    ap.add_argument("--profile", action="store_true", help="print where one compare round spends its time")
    a = ap.parse_args()
    for flag, value in (("--layers", a.layers), ("--vocab", a.vocab)):
        if value and not (a.random_llama_8b or a.tiny):
            ap.error(f"{flag}: only with --random-llama-8b or --tiny")

    import torch

    from kldtool.text.corpus import open_corpus
    from kldtool.engines.defaults import default_transformers_model
    from kldtool.engines.transformers.engine import TransformersEngine
    from kldtool.logitsfile import open_base_file
    from kldtool.runtime.memory import set_malloc_policy
    from kldtool.pipeline import engine_modes, run_compare
    from kldtool.pipeline.sinks import Sinks
    from kldtool.pipeline.base_job import BaseJob
    from kldtool.pipeline.write_base import run_base
    from kldtool.text.protocols import Protocol, llamacpp_windows

    set_malloc_policy()  # as the CLI allocates
    model = a.model
    if a.random_llama_8b or a.tiny:
        t0 = time.perf_counter()
        shape = LLAMA_TINY if a.tiny else LLAMA_8B
        if a.layers:
            shape = dict(shape, num_hidden_layers=a.layers)
        if a.vocab:
            shape = dict(shape, vocab_size=a.vocab)
        engine = random_llama(shape, a.tokenizer or default_transformers_model(), a.device, a.dtype, a.batch)
        print(
            f"made a random Llama-3-{'tiny' if a.tiny else '8B'}-shaped model on {a.device} in "
            f"{time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        model = "random-llama-3"
    else:
        model = model or default_transformers_model()
        engine = TransformersEngine(model, dtype=a.dtype, device=a.device, batch_tokens=a.batch)
    quiet = Sinks(out=lambda s: None, info=lambda s: None)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        corpus = open_corpus(a.text if Path(a.text).exists() else None)
        sizes, base_times = {}, {}
        stores = [("llamacpp", "base.kld", "logprobs"), ("kldtool", "base.kldt", "logprobs")]
        if a.hidden:
            stores.append(("kldtool", "base-hidden.kldt", "hidden"))
        for fmt, fname, store in stores:
            t0 = time.perf_counter()
            job = BaseJob(
                protocol=Protocol(name="llamacpp", n_ctx=a.ctx),
                out_path=os.path.join(tmp, fname),
                chunks=a.chunks,
                fmt=fmt,
                store=store,
            )
            run_base(engine, corpus, job, quiet)
            base_times[fname] = time.perf_counter() - t0
            sizes[fname] = os.path.getsize(os.path.join(tmp, fname))
            print(f"base ({fmt}, {store}): {base_times[fname]:.2f} s, {sizes[fname] / 2**20:.1f} MiB", flush=True)
        reader = open_base_file(os.path.join(tmp, "base.kldt"))
        h = reader.header
        windows = llamacpp_windows(reader.tokens, h.n_ctx, h.n_chunk, engine.bos_id)

        def bare() -> None:
            bare_scoring(engine, windows, a.device)

        def ours() -> None:
            run_compare(engine, reader, sinks=quiet)

        hidden = open_base_file(os.path.join(tmp, "base-hidden.kldt")) if a.hidden else None

        def from_hidden() -> None:
            run_compare(engine, hidden, sinks=quiet)

        def feed() -> None:  # the base rows alone, as compare's feed makes them on the device
            source = engine_modes.rows_source(engine, reader, list(range(h.n_chunk)))
            try:
                for i in range(h.n_chunk):
                    source.rows_torch(i, a.device)
            finally:
                source.close()

        if a.profile:
            import cProfile
            import pstats

            from kldtool.logitsfile import create_writer, iter_chunks

            raw = open_base_file(os.path.join(tmp, "base.kld"))
            w = create_writer(os.path.join(tmp, "converted.kldt"), "kldtool", raw.header, raw.tokens, {})
            for _, rows in iter_chunks(raw, range(raw.header.n_chunk)):
                w.write_chunk(rows)
            w.finish()
            converted = open_base_file(os.path.join(tmp, "converted.kldt"))
            runs = [run_compare(engine, r, sinks=quiet)["statistics"] for r in (raw, raw, converted)]
            for label, other in (("the raw base twice", runs[1]), ("the raw base and its container copy", runs[2])):
                # compared as JSON text: a NaN uncertainty equals itself there
                diff = {
                    k: (runs[0][k], other[k])
                    for k in runs[0]
                    if json.dumps(runs[0][k], sort_keys=True) != json.dumps(other[k], sort_keys=True)
                }
                print(f"{label}: identical statistics: {not diff}; differing: {str(diff)[:300]}")
            converted.close()
            # The device's reducer (Triton on CUDA: its top-k candidates, its copies on a side
            # stream) against the torch ops on the same rows, and the hidden-state file's replay.
            as_run = run_compare(engine, reader, sinks=quiet)["statistics"]
            os.environ["KLDTOOL_REDUCER"] = "torch"
            by_torch = run_compare(engine, reader, sinks=quiet)["statistics"]
            del os.environ["KLDTOOL_REDUCER"]
            print(f"the device's reducer vs the torch ops, container base: {agreement(as_run, by_torch)}")
            if hidden is not None:
                replayed = run_compare(engine, hidden, sinks=quiet)["statistics"]
                print(f"hidden-state base vs container: {agreement(replayed, as_run)}")
            for label, r in (("raw", raw), ("container", reader)):
                prof = cProfile.Profile()
                prof.enable()
                t0 = time.perf_counter()
                run_compare(engine, r, sinks=quiet)
                sync()
                print(f"profile, {label} base: {time.perf_counter() - t0:.3f} s")
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(14)
            raw.close()
            if a.device.startswith("cuda"):
                device_profile(lambda: run_compare(engine, reader, sinks=quiet), sync)

        runs = {"bare": bare, "kldtool": ours, "feed": feed}
        runs["decode"] = lambda: host_decode(reader)
        if hidden is not None:
            runs["hidden"] = from_hidden
        for fn in runs.values():  # warm-up: first-call allocations and kernels (Triton compiles here too)
            fn()
        best = best_alternating(runs, a.rounds, sync)
        reader.close()
        if hidden is not None:
            hidden.close()
    engine.close()
    ratio = best["kldtool"] / best["bare"]
    tokens = len(windows) * h.n_ctx
    target = 1.3 if a.device.startswith("cuda") else 1.05
    row_bytes = h.n_chunk * h.rows_per_chunk * h.row_width * 2
    print(f"bare transformers scoring: {best['bare']:.3f} s ({tokens / best['bare']:.0f} tok/s)")
    print(f"kldtool compare:           {best['kldtool']:.3f} s ({tokens / best['kldtool']:.0f} tok/s)")
    print(f"ratio kldtool / bare: {ratio:.3f} (target <= {target})")
    print(
        f"base-row feed alone: {best['feed']:.3f} s for {row_bytes / 2**30:.2f} GiB of rows "
        f"({row_bytes / best['feed'] / 2**30:.2f} GiB/s): {best['feed'] / best['bare']:.2f} of the bare forward's "
        f"time ({'the device waits for the host' if best['feed'] > best['bare'] else 'the host keeps up'})"
    )
    print(
        f"host decoding alone (read, decompress, check, pin; no device): {best['decode']:.3f} s "
        f"({row_bytes / best['decode'] / 2**30:.2f} GiB/s of rows)"
    )
    if hidden is not None:
        print(
            f"compare from the hidden-state file: {best['hidden']:.3f} s, ratio {best['hidden'] / best['bare']:.3f} "
            f"of the bare forward"
        )
    label = (
        "random Llama-3-8B shape" if a.random_llama_8b else "random Llama-3-tiny shape" if a.tiny else Path(model).name
    )
    if a.layers:
        label += f", {a.layers} of its layers"
    if a.vocab:
        label += f", vocabulary {a.vocab:,}"
    where = f"{torch.cuda.get_device_name()}, torch {torch.__version__}" if a.device.startswith("cuda") else machine()
    append_row(
        f"transformers compare vs bare forward+log_softmax ({label} {a.dtype}, {a.device}, c={a.ctx}, "
        f"{len(windows)} chunks, b={a.batch})",
        f"bare {best['bare']:.3f} s, kldtool {best['kldtool']:.3f} s ({tokens / best['kldtool']:.0f} tok/s)",
        f"ratio {ratio:.3f} (target <= {target})",
        where,
        a.results,
    )
    append_row(
        f"base-row feed alone vs bare forward ({label} {a.dtype}, {a.device}, c={a.ctx}, {len(windows)} chunks, "
        f"container)",
        f"feed {best['feed']:.3f} s ({row_bytes / best['feed'] / 2**30:.2f} GiB/s of rows; its host half alone "
        f"{best['decode']:.3f} s), bare {best['bare']:.3f} s",
        f"feed / bare {best['feed'] / best['bare']:.3f} (over 1: the device waits)",
        where,
        a.results,
    )
    if hidden is not None:
        append_row(
            f"transformers compare from a hidden-state base vs bare forward ({label} {a.dtype}, {a.device}, "
            f"c={a.ctx}, {len(windows)} chunks)",
            f"bare {best['bare']:.3f} s, kldtool {best['hidden']:.3f} s, row file {best['kldtool']:.3f} s",
            f"ratio {best['hidden'] / best['bare']:.3f} (target <= {target})",
            where,
            a.results,
        )
    append_row(
        f"base phase, kldtool container vs llama.cpp raw ({label} {a.dtype}, {a.device}, c={a.ctx}, "
        f"{len(windows)} chunks)",
        f"raw {sizes['base.kld'] / 2**20:.1f} MiB in {base_times['base.kld']:.2f} s, container "
        f"{sizes['base.kldt'] / 2**20:.1f} MiB in {base_times['base.kldt']:.2f} s"
        + (
            f", hidden {sizes['base-hidden.kldt'] / 2**20:.1f} MiB in {base_times['base-hidden.kldt']:.2f} s"
            if a.hidden
            else ""
        ),
        f"size ratio {sizes['base.kldt'] / sizes['base.kld']:.3f}",
        where,
        a.results,
    )


if __name__ == "__main__":
    main()
