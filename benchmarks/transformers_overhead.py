"""Cost of kldtool's compare on top of the transformers engine's bare scoring of the same tokens.

One transformers engine, loaded once, scores the windows of a base file it wrote itself twice
per round, in alternating order: (a) bare: the forward pass in kldtool's batches, log_softmax
in float32 and the target's log-prob gathered and copied to the host (what a perplexity
script does); (b) kldtool's whole compare pipeline (base rows read and decoded, the reducer,
accumulators, printing). Loading is excluded from both. Prints the best time of each and their
ratio, the base phase's time and bytes, and appends a dated row to benchmarks/RESULTS.md.

On a CPU it runs the built-in SmolLM2 (fp32); on a GPU, ``--random-llama-8b DIR`` first writes
a Llama-3-8B-shaped model with random bf16 weights to DIR (any tokenizer directory whose ids
fit, e.g. SmolLM2's, given by --tokenizer), so no download is needed.

    .venv/bin/python benchmarks/transformers_overhead.py [--ctx 512] [--chunks 16] [--rounds 2]
    python benchmarks/transformers_overhead.py --device cuda --dtype bfloat16 --ctx 2048 \\
        --random-llama-8b /tmp/llama8b --tokenizer TOKDIR
"""

from __future__ import annotations

import argparse
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
LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0)


def write_random_llama(directory: str, tokenizer_dir: str) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(LlamaConfig(**LLAMA_8B))
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(directory)
    del model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: the built-in fp32 SmolLM2)")
    ap.add_argument("--random-llama-8b", default=None, metavar="DIR")
    ap.add_argument("--tokenizer", default=None, help="tokenizer directory for --random-llama-8b")
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

    import numpy as np
    import torch

    from kldtool.corpus import open_corpus
    from kldtool.engines.defaults import default_transformers_model
    from kldtool.engines.transformers import TransformersEngine
    from kldtool.logitsfile import open_base_file
    from kldtool.pipeline import run_compare
    from kldtool.pipeline.common import Sinks
    from kldtool.pipeline.write_base import run_base
    from kldtool.protocols import Protocol, llamacpp_windows

    model = a.model
    if a.random_llama_8b:
        t0 = time.perf_counter()
        write_random_llama(a.random_llama_8b, a.tokenizer)
        print(f"wrote a random Llama-3-8B-shaped model in {time.perf_counter() - t0:.0f} s", flush=True)
        model = a.random_llama_8b
    model = model or default_transformers_model()
    engine = TransformersEngine(model, dtype=a.dtype, device=a.device, batch_tokens=a.batch)
    quiet = Sinks(out=lambda s: None, info=lambda s: None)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        corpus = open_corpus(a.text if Path(a.text).exists() else None)
        sizes, base_times = {}, {}
        for fmt, fname in (("llamacpp", "base.kld"), ("kldtool", "base.kldt")):
            t0 = time.perf_counter()
            run_base(engine, corpus, Protocol("llamacpp", a.ctx), a.chunks, os.path.join(tmp, fname), fmt, sinks=quiet)
            base_times[fmt] = time.perf_counter() - t0
            sizes[fmt] = os.path.getsize(os.path.join(tmp, fname))
            print(f"base ({fmt}): {base_times[fmt]:.2f} s, {sizes[fmt] / 2**20:.1f} MiB", flush=True)
        reader = open_base_file(os.path.join(tmp, "base.kldt"))
        h = reader.header
        windows = llamacpp_windows(reader.tokens, h.n_ctx, h.n_chunk, engine.bos_id)
        per_call = engine.windows_per_call(h.n_ctx)

        def bare() -> None:
            for i in range(0, len(windows), per_call):
                batch = windows[i:i + per_call]
                ids = torch.from_numpy(np.stack([w.tokens for w in batch]).astype("int64"))
                ids = ids.to(a.device)
                first, n = batch[0].first, batch[0].n_scored
                with torch.inference_mode():
                    lg = engine.model(input_ids=ids, logits_to_keep=ids.shape[1] - first, use_cache=False).logits
                    logp = torch.log_softmax(lg[:, :n].float(), dim=-1)
                    tgt = torch.as_tensor(np.stack([w.targets for w in batch]), device=a.device)
                    logp.gather(2, tgt[:, :, None]).cpu()

        def ours() -> None:
            run_compare(engine, reader, sinks=quiet)

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
                diff = {k: (runs[0][k], other[k]) for k in runs[0] if runs[0][k] != other[k]}
                print(f"{label}: identical statistics: {not diff}; differing: {str(diff)[:300]}")
            converted.close()
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

        bare()  # warm-up: first-call allocations and kernels (Triton compiles here too)
        ours()
        best = best_alternating({"bare": bare, "kldtool": ours}, a.rounds, sync)
        reader.close()
    engine.close()
    ratio = best["kldtool"] / best["bare"]
    tokens = len(windows) * h.n_ctx
    print(f"bare transformers scoring: {best['bare']:.3f} s ({tokens / best['bare']:.0f} tok/s)")
    print(f"kldtool compare:           {best['kldtool']:.3f} s ({tokens / best['kldtool']:.0f} tok/s)")
    print(f"ratio kldtool / bare: {ratio:.3f} (target <= 1.05)")
    label = "random Llama-3-8B shape" if a.random_llama_8b else Path(model).name
    where = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}" if a.device.startswith("cuda")
             else machine())
    append_row(f"transformers compare vs bare forward+log_softmax ({label} {a.dtype}, {a.device}, c={a.ctx}, "
               f"{len(windows)} chunks, b={a.batch})",
               f"bare {best['bare']:.3f} s, kldtool {best['kldtool']:.3f} s ({tokens / best['kldtool']:.0f} tok/s)",
               f"ratio {ratio:.3f}", where, a.results)
    append_row(f"base phase, kldtool container vs llama.cpp raw ({label} {a.dtype}, {a.device}, c={a.ctx}, "
               f"{len(windows)} chunks)",
               f"raw {sizes['llamacpp'] / 2**20:.1f} MiB in {base_times['llamacpp']:.2f} s, container "
               f"{sizes['kldtool'] / 2**20:.1f} MiB in {base_times['kldtool']:.2f} s",
               f"size ratio {sizes['kldtool'] / sizes['llamacpp']:.3f}", where, a.results)


if __name__ == "__main__":
    main()
