"""Hidden-state base files (``base --store hidden``, issue 19): their size against llama.cpp's
raw layout on the whole corpus, and compare's speed from them against the row container.

Size: the built-in Q4_1 GGUF (llama.cpp engine: float32 final-norm states, its tied Q8_0 head
stored once) over every chunk of wikitext-2 at ``--ctx``; the hidden file is then expanded by
``kldtool convert --to llamacpp`` into the raw layout llama-perplexity reads, and both files'
bytes on disk are counted (the head included).

Speed: the same base model over ``--chunks`` chunks stored twice, as full rows (kldtool's
container) and as hidden states; each quant is compared against both, alternating, best of
``--rounds``, and the printed mean KLD of the two compares is checked to agree.

With ``--peer``, llama-perplexity itself (built as benchmarks/llamacpp_peer.py builds it) writes
its own raw base file of the same chunks and compares each quant against it and against the
hidden file expanded to the raw layout. Appends dated rows to benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/hidden_base.py [--ctx 512] [--size-chunks -1] [--chunks 20] [--types Q8_0,Q4_K_M,Q2_K] [--peer]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from base_fixture import ROOT, WIKI, kldtool
from results import append_row
from timing import best_alternating

CACHE = Path(os.environ.get("KLDTOOL_BENCH_DIR", Path.home() / ".cache" / "kldtool" / "hidden"))


def size_row(ctx: int, chunks: int) -> None:
    name = "all" if chunks < 0 else chunks
    hidden, raw = CACHE / f"size-hidden-c{ctx}-{name}.kldt", CACHE / f"size-raw-c{ctx}-{name}.bin"
    if not hidden.exists():
        limit = () if chunks < 0 else ("--chunks", chunks)
        kldtool("base", "-f", WIKI, "-c", ctx, *limit, "--store", "hidden", "--kl-divergence-base", hidden)
    kldtool("convert", hidden, raw, "--to", "llamacpp")
    info = json.loads(
        subprocess.run(
            [sys.executable, "-m", "kldtool", "info", "--json", hidden],
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        ).stdout
    )
    h, r = hidden.stat().st_size, raw.stat().st_size
    tokens, n_chunk = info["scored_tokens"], info["n_chunk"]
    raw.unlink()  # tens of GB at scale: counted, not kept
    print(f"whole-corpus sizes: hidden {h:,} B (head {info['head_bytes']:,} B), raw {r:,} B, raw/hidden {r / h:.1f}")
    append_row(
        "hidden_base size (llamacpp engine, Q4_1 GGUF, float32 states + tied Q8_0 head)",
        f"c={ctx}, {n_chunk} chunks ({name}), {tokens:,} scored tokens: hidden file {h:,} B "
        f"(head {info['head_bytes']:,} B) vs llama.cpp raw layout {r:,} B (kldtool convert --to llamacpp)",
        f"1/{r / h:.1f} of raw",
    )


def speed_row(ctx: int, chunks: int, types: list[str], rounds: int) -> None:
    from kldtool.engines.defaults import default_gguf
    from kldtool.engines.llamacpp.quantize import quantize

    rows, hidden = CACHE / f"rows-c{ctx}-{chunks}.kldt", CACHE / f"hidden-c{ctx}-{chunks}.kldt"
    for path, extra in ((rows, ()), (hidden, ("--store", "hidden"))):
        if not path.exists():
            kldtool("base", "-f", WIKI, "-c", ctx, "--chunks", chunks, *extra, "--kl-divergence-base", path)
    figures, worst = [], 0.0
    for t in types:
        quant = CACHE / f"requant-{t}.gguf"
        if not quant.exists():
            quantize(default_gguf(), str(quant), t)
        out = {"rows": CACHE / f"{t}-rows.json", "hidden": CACHE / f"{t}-hidden.json"}
        runs = {
            k: (lambda k=k, b=b: kldtool("compare", "-m", quant, "--kl-divergence-base", b, "--json", out[k]))
            for k, b in (("rows", rows), ("hidden", hidden))
        }
        best = best_alternating(runs, rounds)
        kld = {k: json.loads(p.read_text())["statistics"]["kld_mean"]["value"] for k, p in out.items()}
        ratio = best["hidden"] / best["rows"]
        worst = max(worst, ratio)
        print(
            f"{t}: rows {best['rows']:.2f} s, hidden {best['hidden']:.2f} s, ratio {ratio:.3f}; "
            f"mean KLD {kld['rows']:.6f} vs {kld['hidden']:.6f}"
        )
        figures.append(f"{t} {best['rows']:.2f} / {best['hidden']:.2f} s (KLD {kld['rows']:.6f} / {kld['hidden']:.6f})")
    append_row(
        "hidden_base speed (compare --engine llamacpp from the row container / from hidden states)",
        f"c={ctx}, {chunks} chunks, best of {rounds}: " + "; ".join(figures),
        f"{worst:.3f} (worst)",
    )


def printed(text: str, label: str) -> str:
    """The value llama-perplexity prints after ``label`` (first number and its ±)."""
    line = next((l for l in text.splitlines() if l.startswith(label)), "")
    return line.split(":", 1)[1].strip() if line else "?"


def peer_row(ctx: int, chunks: int, types: list[str]) -> None:
    """llama-perplexity itself reads a hidden file expanded by ``convert --to llamacpp``: its
    printed KLD, same top and PPL(Q) against that file beside those against the raw base file
    it writes itself from the same model and chunks."""
    from llamacpp_peer import build_peer, timed

    from kldtool.engines.defaults import default_gguf

    peer = build_peer()
    theirs, ours = CACHE / f"peer-base-c{ctx}-{chunks}.kld", CACHE / f"expanded-c{ctx}-{chunks}.kld"
    if not theirs.exists():
        timed(
            [
                peer,
                "-m",
                default_gguf(),
                "-f",
                WIKI,
                "-c",
                ctx,
                "--chunks",
                chunks,
                "-t",
                2,
                "--kl-divergence-base",
                theirs,
            ]
        )
    kldtool("convert", CACHE / f"hidden-c{ctx}-{chunks}.kldt", ours, "--to", "llamacpp")
    figures = []
    for t in types:
        out = {
            name: timed(
                [
                    peer,
                    "-m",
                    CACHE / f"requant-{t}.gguf",
                    "--kl-divergence",
                    "-c",
                    ctx,
                    "-t",
                    2,
                    "--kl-divergence-base",
                    base,
                ]
            )[1]
            for name, base in (("own", theirs), ("expanded", ours))
        }
        got = {
            name: {k: printed(o, k) for k in ("Mean    KLD", "Same top p", "Mean PPL(Q)")} for name, o in out.items()
        }
        print(
            f"{t}: llama-perplexity against its own base file {got['own']}, against the expanded hidden "
            f"file {got['expanded']}"
        )
        figures.append(
            f"{t} mean KLD {got['own']['Mean    KLD']} / {got['expanded']['Mean    KLD']}, same top "
            f"{got['own']['Same top p']} / {got['expanded']['Same top p']}"
        )
    ours.unlink()
    append_row(
        "hidden_base: llama-perplexity --kl-divergence against its own raw base file / against kldtool's "
        "hidden file expanded by convert --to llamacpp",
        f"c={ctx}, {chunks} chunks: " + "; ".join(figures),
        "see figures",
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument(
        "--size-chunks", type=int, default=-1, help="chunks for the size row (-1: the whole corpus; 0: skip)"
    )
    ap.add_argument("--chunks", type=int, default=20, help="chunks for the speed row (0: skip)")
    ap.add_argument("--types", default="Q8_0,Q4_K_M,Q2_K")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--peer",
        action="store_true",
        help="also have llama-perplexity (benchmarks/llamacpp_peer.py's "
        "build) read the hidden file expanded to its raw layout",
    )
    args = ap.parse_args()
    CACHE.mkdir(parents=True, exist_ok=True)
    if args.size_chunks:
        size_row(args.ctx, args.size_chunks)
    if args.chunks:
        speed_row(args.ctx, args.chunks, args.types.split(","), args.rounds)
        if args.peer:
            peer_row(args.ctx, args.chunks, args.types.split(","))


if __name__ == "__main__":
    main()
