"""The parts of llama-perplexity's printout that kldtool reproduces character for character: its
chunk table and its three statistic blocks. The parity tests and benchmarks/llamacpp_gpu.py
cut both tools' output with these, then compare line by line."""

from __future__ import annotations


def final_block_lines(text: str) -> list[str]:
    """The three statistic blocks of llama-perplexity output (from the first '======' line)."""
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("====== Perplexity statistics"))
    end = next(i for i, l in enumerate(lines) if l.startswith("Same top p"))
    return lines[start : end + 1]


def chunk_table_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("chunk             PPL"))
    out = []
    for l in lines[start + 1 :]:
        if not l.strip():
            break
        out.append(l)
    return out
