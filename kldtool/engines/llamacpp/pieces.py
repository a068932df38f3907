"""How a batch of llama-perplexity's windows may be cut into pieces a lane decodes on their own
(lanes.py) with logits bit-identical to the whole batch's.

What a batch's composition can change is the kernels a token goes through. llama-perplexity's
context keeps a KV stream per sequence, so llama.cpp cuts a batch into ubatches of the same
t = n_ubatch / n_seq positions of every sequence; the quantized matmuls take a ubatch's rows in
groups of 4 and any rest through another kernel, and ggml's flash attention takes a stream's
queries through its tiled kernel when there are at least 64 of them, else one by one. A batch
whose every ubatch has rows and output rows in fours and 64 positions or more per sequence
gives each token the same kernels as any such piece of it: a lane decodes those pieces on their
own (``lane_pieces``: one 512-token chunk at a time at c=512), logits bit-identical (sha256 of
each chunk's logits at c=512, 256 and 128 for four quant types; tests/test_llamacpp_lanes.py
checks c=256), and no lane waits through a last partial round.
"""

from __future__ import annotations

from kldtool.text.protocols import Window

FA_TILE_Q = 64  # ggml-cpu's flash attention: a stream's queries go through its tiled kernel from this many


def same_kernels(batch: list[Window], ubatch: int) -> bool:
    """Whether every ubatch of ``batch``'s decode has rows and output rows in fours and at
    least FA_TILE_Q positions of each sequence (llama.cpp's equal split: the same ``t``
    positions of every sequence per ubatch): then each token's kernels do not depend on the
    other sequences beside it."""
    n_tokens = len(batch[0].tokens)
    t = ubatch // len(batch)
    for a in range(0, n_tokens, max(t, 1)):
        k = min(t, n_tokens - a)
        outputs = sum(max(0, a + k - max(a, w.first)) for w in batch)
        if k < min(FA_TILE_Q, n_tokens) or (len(batch) * k) % 4 or outputs % 4:
            return False
    return True


def lane_pieces(batch: list[Window], n_ubatch: int, batch_tokens: int) -> list[list[Window]]:
    """``batch`` cut into the smallest equal pieces whose every token meets the same kernels, or
    ``[batch]`` where none can be cut."""
    n_tokens = len(batch[0].tokens)
    if len(batch) == 1 or n_tokens > batch_tokens:
        return [batch]
    ubatch = min(n_ubatch, max(1, batch_tokens // n_tokens) * n_tokens)  # the whole batch's context
    if not same_kernels(batch, ubatch):
        return [batch]
    for size in range(1, len(batch)):
        pieces = [batch[i : i + size] for i in range(0, len(batch), size)]
        if all(same_kernels(p, min(ubatch, len(p) * n_tokens)) for p in pieces):
            return pieces
    return [batch]
