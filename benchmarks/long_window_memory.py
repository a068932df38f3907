"""Peak RSS of `kldtool ppl`, or of `base` + `compare`, on one long window (2k, 8k, 16k tokens).

A window longer than -b tokens is evaluated in blocks through the model's KV cache, so the
logits held at once are O(block x vocab), not O(window x vocab) (16k x 49,152 float32 logits
alone are 3 GiB). Each run is a fresh process on the built-in SmolLM2 (transformers, fp32, one
exl3 window of L tokens); its own peak RSS comes from wait4(). Windows beyond SmolLM2's 8k
training context run with --force: this measures memory, not quality. Prints the table, the
16k/2k ratio for both modes and what the logits alone would take, and appends a dated row to
benchmarks/RESULTS.md.

With ``--phase compare`` each length writes a base file (kldtool's container, in frames of
about 8 MiB) and compares the same model against it, block-wise: the peaks of both processes,
beside the size of the window's KV cache (which any attention model holds) and of its uint16
base rows (which neither process holds whole any more); at --check-length the statistics are
checked against a one-frame-per-window copy of the base. ``--phase step`` runs the python
engine's step API (tests/helpers/tiny_lm.py, a recurrent model) on long documents.

    .venv/bin/python benchmarks/long_window_memory.py [--lengths 2048,8192,16384] [--block 512] [--whole 2048]
    .venv/bin/python benchmarks/long_window_memory.py --phase compare --lengths 2048,8192,16384,32768
    .venv/bin/python benchmarks/long_window_memory.py --phase step
    .venv/bin/python benchmarks/long_window_memory.py --phase llamacpp --lengths 8192,32768,131072 --peer

``--phase engines`` (benchmarks/long_window_engines.py): the same model through transformers and
llama.cpp at each length, each engine's base compared by the other, and every KV-cache type of
--kv-types at the longest length; ``--phase protocols``: one window of the longest length under
the stride and documents protocols (every position scored, depth 1 on), the first of --kv-types
against the f16-cache base.

``--phase llamacpp`` (benchmarks/long_window_llamacpp.py): llama.cpp's base and compare of one
window up to 131,072 tokens at Llama 3's vocabulary, KV-cache types at the longest, and
llama-perplexity at the same lengths, all under one memory limit.
"""

from __future__ import annotations

import argparse

import os
import tempfile

from compare_peak_memory import WIKI, run_measured
from results import append_row

VOCAB = 49152


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="2048,8192,16384")
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--whole", default="2048", help="lengths also run as one whole window (-b = L)")
    ap.add_argument("--text", default=str(WIKI))
    ap.add_argument("--phase", choices=("ppl", "compare", "step", "llamacpp", "engines", "protocols"), default="ppl")
    ap.add_argument("--policies", default="heap,mmap", help="llamacpp: KLDTOOL_MALLOC policies, each run")
    ap.add_argument("--kv-types", default="q8_0,q4_0", help="llamacpp: compare's caches (the first at every length)")
    ap.add_argument("--protocols", default="stride,documents", help="protocols: which, at the longest length")
    ap.add_argument("--limit-gib", type=float, default=16.0, help="llamacpp: the memory every process runs under")
    ap.add_argument("--peer", action="store_true", help="llamacpp: also run llama-perplexity at each length")
    ap.add_argument("--out", default="long-window-results", help="llamacpp: where compare's JSON results go")
    ap.add_argument("--work", default=tempfile.gettempdir() + "/kldtool-long-window", help="llamacpp: base files")
    ap.add_argument(
        "--check-length",
        type=int,
        default=8192,
        help="compare: the length also compared against a one-frame copy of its base",
    )
    ap.add_argument("--doc-lengths", default="1024,5120,10240,16384", help="step: document lengths")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    if a.phase == "compare":
        return compare_phase(a, lengths)
    if a.phase == "step":
        return step_phase(a)
    if a.phase == "llamacpp":
        from long_window_llamacpp import llamacpp_phase

        return llamacpp_phase(a, lengths)
    if a.phase in ("engines", "protocols"):
        import long_window_engines

        return getattr(long_window_engines, f"{a.phase}_phase")(a, lengths)
    whole = [int(x) for x in a.whole.split(",") if x]
    rows = {}
    for mode, ls in (("block", lengths), ("whole", whole)):
        for n in ls:
            b = a.block if mode == "block" else n
            rss, wall = run_measured(
                [
                    "ppl",
                    "--engine",
                    "transformers",
                    "-f",
                    a.text,
                    "--protocol",
                    "exl3",
                    "-c",
                    str(n),
                    "--stride",
                    str(n),
                    "--chunks",
                    "1",
                    "-b",
                    str(b),
                    "--force",
                ]
            )
            rows[mode, n] = rss
            print(
                f"{mode:5s} L={n:6d} (-b {b:6d}): peak RSS {rss:8.1f} MiB, {wall:6.1f} s; "
                f"window x vocab float32 logits alone: {n * VOCAB * 4 / 2**20:8.1f} MiB",
                flush=True,
            )
    lo, hi = lengths[0], lengths[-1]
    ratio = rows["block", hi] / rows["block", lo]
    print(
        f"block-wise peak RSS ratio, {hi} vs {lo} tokens: {ratio:.2f} (window grows {hi / lo:.0f}x; "
        f"the logits alone would grow by {(hi - lo) * VOCAB * 4 / 2**20:.0f} MiB)"
    )
    if ("whole", whole[-1]) in rows if whole else False:
        print(
            f"whole-window peak RSS at {whole[-1]}: {rows['whole', whole[-1]]:.0f} MiB vs block-wise "
            f"{rows['block', whole[-1]]:.0f} MiB"
        )
    figures = ", ".join(f"{m} {n // 1024}k {rss:.0f} MiB" for (m, n), rss in rows.items())
    append_row(
        f"ppl peak RSS, one long window (transformers fp32 SmolLM2, block {a.block})",
        figures,
        f"block-wise {hi // 1024}k/{lo // 1024}k {ratio:.2f}",
    )


def kv_bytes_per_token() -> int:
    """K and V of every layer for one token, in float32: what the KV cache adds per token."""
    import json
    from pathlib import Path

    from kldtool.engines.defaults import default_transformers_model

    c = json.loads((Path(default_transformers_model()) / "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_hidden_layers"] * 2 * c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim * 4


def _stats(path: str) -> tuple[float, float]:
    import json

    with open(path) as f:
        s = json.load(f)["statistics"]
    return s["kld_mean"]["value"], s["ppl_q"]["value"]


def compare_phase(a, lengths: list[int]) -> None:
    """Base and compare of one window per length, the container in frames (the default); at
    --check-length the base is also converted to one frame per window and compared again:
    the statistics must be equal."""
    window = [
        "--engine",
        "transformers",
        "-f",
        a.text,
        "--protocol",
        "exl3",
        "--chunks",
        "1",
        "-b",
        str(a.block),
        "--force",
    ]
    kv = kv_bytes_per_token()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in lengths:
            base = os.path.join(tmp, f"base-{n}.kldt")
            rss_b, wall_b = run_measured(
                ["base", *window, "-c", str(n), "--stride", str(n), "--kl-divergence-base", base]
            )
            out = os.path.join(tmp, f"c-{n}.json")
            rss_c, wall_c = run_measured(
                [
                    "compare",
                    "--engine",
                    "transformers",
                    "-b",
                    str(a.block),
                    "--force",
                    "--kl-divergence-base",
                    base,
                    "--json",
                    out,
                ]
            )
            rows[n] = (rss_b, rss_c, kv * n / 2**20)
            print(
                f"L={n:6d} (-b {a.block}): base peak RSS {rss_b:8.1f} MiB ({wall_b:6.1f} s), compare "
                f"{rss_c:8.1f} MiB ({wall_c:6.1f} s); KV cache {kv * n / 2**20:7.1f} MiB; the window's uint16 "
                f"base rows: {n * (VOCAB + 4) * 2 / 2**20:7.1f} MiB",
                flush=True,
            )
            if n == a.check_length:
                one = os.path.join(tmp, f"one-{n}.kldt")
                run_measured(["convert", base, one, "--to", "kldtool", "--frame-rows", "0"])
                out1 = os.path.join(tmp, f"c1-{n}.json")
                run_measured(
                    [
                        "compare",
                        "--engine",
                        "transformers",
                        "-b",
                        str(a.block),
                        "--force",
                        "--kl-divergence-base",
                        one,
                        "--json",
                        out1,
                    ]
                )
                (k, p), (k1, p1) = _stats(out), _stats(out1)
                same = "equal" if (k, p) == (k1, p1) else "DIFFER"
                print(f"L={n}: mean KLD {k:.9g} / {k1:.9g}, PPL(Q) {p:.9g} / {p1:.9g} (frames / one frame): {same}")
    lo, hi = lengths[0], lengths[-1]
    grow = {m: rows[hi][m] / rows[lo][m] for m in (0, 1)}
    # What the run holds beyond the KV cache, which any attention model needs for the window.
    net = {m: (rows[hi][m] - rows[hi][2]) / (rows[lo][m] - rows[lo][2]) for m in (0, 1)}
    print(
        f"peak RSS {hi // 1024}k/{lo // 1024}k: base {grow[0]:.2f}, compare {grow[1]:.2f}; without the KV "
        f"cache: base {net[0]:.2f}, compare {net[1]:.2f}"
    )
    append_row(
        f"base + compare peak RSS, one long window, container in frames (transformers fp32 SmolLM2, "
        f"block {a.block}; KV cache {kv // 1024} KiB/token)",
        ", ".join(f"{n // 1024}k base {b:.0f} / compare {c:.0f} MiB (KV {k:.0f})" for n, (b, c, k) in rows.items()),
        f"{hi // 1024}k/{lo // 1024}k base {grow[0]:.2f}, compare {grow[1]:.2f}; "
        f"less the KV cache {net[0]:.2f}, {net[1]:.2f}",
    )


def step_phase(a) -> None:
    """The python engine's step API: tests/helpers/tiny_lm.py (a recurrent model) on documents
    of the given lengths, one length per process, in blocks of -b and as one whole window."""
    import json

    tiny = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "helpers", "tiny_lm.py")
    lengths = [int(x) for x in a.doc_lengths.split(",")]
    text = open(a.text, encoding="utf-8").read()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        docs = os.path.join(tmp, "docs.jsonl")
        with open(docs, "w") as f:
            for i in range(3):
                f.write(json.dumps({"text": text[i * (max(lengths) + 1000) : (i + 1) * (max(lengths) + 1000)]}) + "\n")
        for n in lengths:
            for mode, b in (("step", a.block), ("whole", max(lengths) + 1)):
                out = os.path.join(tmp, f"{mode}-{n}.json")
                rss, wall = run_measured(
                    [
                        "ppl",
                        "--engine",
                        "python",
                        "-m",
                        f"{tiny}:make_base",
                        "-f",
                        docs,
                        "--protocol",
                        "documents",
                        "--lengths",
                        str(n),
                        "-b",
                        str(b),
                        "--json",
                        out,
                    ]
                )
                with open(out) as f:
                    rows[mode, n] = (rss, json.load(f)["ppl"])
            (rs, ps), (rw, pw) = rows["step", n], rows["whole", n]
            print(
                f"N={n:6d}: step (-b {a.block}) {rs:7.1f} MiB PPL {ps:.9g}; whole window {rw:7.1f} MiB "
                f"PPL {pw:.9g}; relative difference {abs(ps - pw) / pw:.1e}",
                flush=True,
            )
    lo, hi = lengths[0], lengths[-1]
    ratio = rows["step", hi][0] / rows["step", lo][0]
    worst = max(abs(rows["step", n][1] - rows["whole", n][1]) / rows["whole", n][1] for n in lengths)
    append_row(
        f"python engine step API, recurrent tiny_lm, documents (block {a.block})",
        ", ".join(f"{n} tokens step {rows['step', n][0]:.0f} / whole {rows['whole', n][0]:.0f} MiB" for n in lengths),
        f"step {hi}/{lo} peak RSS {ratio:.2f}; PPL step vs whole within {worst:.1e}",
    )


if __name__ == "__main__":
    main()
