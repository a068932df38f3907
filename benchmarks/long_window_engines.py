"""`long_window_memory.py --phase engines`: one window of 8k, 32k and 131,072 tokens through
llama.cpp and transformers, each engine's base compared by the other, then every KV-cache type
at the longest length against the f16-cache base; ``--phase protocols``: one window of the
longest length under the stride and documents protocols, every position scored.

The model is tests/helpers' llama3-128k (Llama 3's 128,256 vocabulary and 131,072-token
context, rope base 500,000, 2 layers of 2 query heads and one key-value head of 64), as its
checkpoint (transformers, float32, blocks of -b tokens through the KV cache, so no
window x window score matrix) and as its F16 GGUF (llama.cpp, flash attention on). Each length,
llama.cpp's protocol (one window, its second half scored), each run a fresh process:

- ``base`` of the GGUF (f16 cache) and of the checkpoint, peak RSS from wait4() beside each
  engine's KV cache by its size formula;
- ``compare`` of the GGUF against the checkpoint's base: mean KLD of every depth bucket (the
  two engines' rounding only; the issue's bound is 1e-4), and of the checkpoint against the
  GGUF's base (transformers' compare memory);
- at the longest length, ``compare`` of the GGUF with every cache type of --kv-types against
  the f16-cache base (their JSON, depth tables included, go to --out for ``report --plots``).

Every process runs under KLDTOOL_MALLOC=mmap (kldtool's default from 16,384 tokens, here at
every length so that the lengths compare) in one cgroup of --limit-gib. Each step appends its
dated row to benchmarks/RESULTS.md as it ends, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from long_window_llamacpp import NAME, kldtool_run, kv_bytes, run_places
from results import append_row

ENV = {"KLDTOOL_MALLOC": "mmap"}


def engines_phase(a, lengths: list[int]) -> None:
    from helpers.vocab_gguf import gguf_of
    from helpers.vocab_models import corpus, model_dir

    ckpt = model_dir(NAME)
    cfg = json.loads((ckpt / "config.json").read_text())
    gguf, ids = gguf_of(NAME), corpus(NAME, ids=True)
    procs, where, out, work = run_places(a)
    llama = ["-m", str(gguf), "--flash-attn", "on"]
    for n in lengths:
        window = ["-f", str(ids), "--corpus-format", "ids", "-c", str(n), "--chunks", "1"]
        g_base, t_base = work / f"gguf-{n}.kldt", work / f"ckpt-{n}.kldt"
        gb = kldtool_run(["base", *llama, *window, "--kl-divergence-base", str(g_base)], ENV, procs)
        tb = kldtool_run(["base", "-m", str(ckpt), *window, "--kl-divergence-base", str(t_base)], ENV, procs)
        gc, g_stats = _compare(llama, t_base, out / f"gguf-vs-ckpt-{n // 1024}k.json", procs)
        t_base.unlink()
        tc, t_stats = _compare(["-m", str(ckpt)], g_base, out / f"ckpt-vs-gguf-{n // 1024}k.json", procs)
        worst = max(abs(r["kld_mean"]) for r in g_stats["depth"]["rows"])
        kv = {"llama.cpp": kv_bytes(n, cfg) / 2**20, "transformers": kv_bytes(n, cfg, 4.0) / 2**20}
        line = (
            f"llama.cpp base {gb[0]:.0f} MiB {gb[1]:.0f} s, compare {gc[0]:.0f} MiB {gc[1]:.0f} s "
            f"(KV cache {kv['llama.cpp']:.0f} MiB); transformers base {tb[0]:.0f} MiB {tb[1]:.0f} s, "
            f"compare {tc[0]:.0f} MiB {tc[1]:.0f} s (KV cache {kv['transformers']:.0f} MiB)"
        )
        print(f"L={n}: {line}", flush=True)
        append_row(
            f"Two engines, one window of {n:,} tokens (llama3-128k checkpoint fp32 and F16 GGUF, FA on; "
            f"KLDTOOL_MALLOC=mmap; {where})",
            line,
            f"GGUF vs checkpoint's base: mean KLD {g_stats['kld_mean']['value']:.3g}, worst depth bucket "
            f"{worst:.3g} of {len(g_stats['depth']['rows'])}; checkpoint vs GGUF's base "
            f"{t_stats['kld_mean']['value']:.3g}",
        )
        if n != lengths[-1]:
            g_base.unlink()
    for kv in a.kv_types.split(","):
        usage, s = _compare([*llama, "--kv-cache-dtype", kv], g_base, out / f"kv-{kv}-{n // 1024}k.json", procs)
        print(f"L={n} kv {kv}: mean KLD {s['kld_mean']['value']:.4g}, {usage[0]:.0f} MiB {usage[1]:.0f} s", flush=True)
        append_row(
            f"KV-cache {kv} at {n:,} tokens against the f16-cache base (llama3-128k F16 GGUF, FA on; {where})",
            f"compare {usage[0]:.0f} MiB, {usage[1]:.0f} s",
            f"mean KLD {s['kld_mean']['value']:.3g}, same top {100 * s['same_top_p']['value']:.2f} %",
        )
    g_base.unlink()


def protocols_phase(a, lengths: list[int]) -> None:
    """One window of the longest length under --protocols (every position scored, so the depth
    table starts at 1): the GGUF's f16-cache base, then its compare with the first of --kv-types."""
    from helpers.vocab_gguf import gguf_of
    from helpers.vocab_models import corpus

    n, kv = lengths[-1], a.kv_types.split(",")[0]
    procs, where, out, work = run_places(a)
    ids = corpus(NAME, ids=True)
    # The corpus is short documents (one per line); documents wants one of n tokens: the stream
    # cut into two documents of n + 1 tokens.
    stream = " ".join(ids.read_text().split()).split()
    docs = work / "two-documents.ids"
    docs.write_text("\n".join(" ".join(stream[i * (n + 1) : (i + 1) * (n + 1)]) for i in range(2)) + "\n")
    llama = ["-m", str(gguf_of(NAME)), "--flash-attn", "on"]
    windows = {
        "stride": ["-f", str(ids), "--protocol", "stride", "-c", str(n), "--stride", str(n // 2)],
        "documents": ["-f", str(docs), "--protocol", "documents", "--lengths", str(n)],
    }
    for name in a.protocols.split(","):
        base = work / f"{name}-{n}.kldt"
        flags = [*windows[name], "--corpus-format", "ids", "--chunks", "1"]
        b = kldtool_run(["base", *llama, *flags, "--kl-divergence-base", str(base)], ENV, procs)
        c, s = _compare([*llama, "--kv-cache-dtype", kv], base, out / f"{name}-kv-{kv}-{n // 1024}k.json", procs)
        size = base.stat().st_size
        base.unlink()
        rows = s["depth"]["rows"]
        line = f"base {b[0]:.0f} MiB {b[1]:.0f} s ({size / 2**30:.1f} GiB file), compare {c[0]:.0f} MiB {c[1]:.0f} s"
        print(f"{name} L={n}: {line}; {s['count']} tokens, mean KLD {s['kld_mean']['value']:.4g}", flush=True)
        append_row(
            f"--protocol {name}, one window of {n:,} tokens, every position scored: {kv} cache against the "
            f"f16-cache base (llama3-128k F16 GGUF, FA on; KLDTOOL_MALLOC=mmap; {where})",
            line,
            f"{s['count']:,} tokens, mean KLD {s['kld_mean']['value']:.3g}; depth {rows[0]['bucket']}: "
            f"{rows[0]['kld_mean']:.3g}, depth {rows[-1]['bucket']}: {rows[-1]['kld_mean']:.3g}",
        )
    docs.unlink()


def _compare(flags: list[str], base: Path, js: Path, procs) -> tuple[tuple[float, float], dict]:
    """(peak RSS MiB, wall s) and the statistics of one compare against ``base``."""
    usage = kldtool_run(["compare", *flags, "--kl-divergence-base", str(base), "--json", str(js)], ENV, procs)
    return usage, json.loads(js.read_text())["statistics"]


if __name__ == "__main__":
    sys.exit("run through benchmarks/long_window_memory.py --phase engines")
