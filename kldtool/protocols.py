"""Scoring protocols: pure functions from a token stream to the windows an engine evaluates.

Only ``llamacpp`` exists so far (DESIGN.md "Scoring protocols"): non-overlapping chunks of
n_ctx tokens, the first token replaced by BOS for evaluation when the model wants one, and
the predictions at offsets n_ctx/2 .. n_ctx-2 scored against the next token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kldtool.errors import TextTooShort, UsageError


@dataclass(frozen=True)
class Window:
    index: int  # chunk number, 0-based
    tokens: np.ndarray  # int32, exactly what the engine evaluates (BOS substituted)
    first: int  # offset of the first position whose logits are scored
    targets: np.ndarray  # int64 ids the scored positions predict (original tokens)

    @property
    def n_scored(self) -> int:
        return len(self.targets)


def llamacpp_chunk_count(n_tokens: int, n_ctx: int, chunks: int | None) -> int:
    if n_ctx < 4:
        raise UsageError(f"--ctx-size {n_ctx}: must be at least 4")
    if n_tokens < 2 * n_ctx:
        raise TextTooShort(
            f"the text tokenizes to {n_tokens} tokens; at least {2 * n_ctx} (2 x --ctx-size {n_ctx}) are needed"
        )
    n_chunk = n_tokens // n_ctx
    if chunks is not None:
        if chunks < 1:
            raise UsageError(f"--chunks {chunks}: must be at least 1")
        n_chunk = min(n_chunk, chunks)
    return n_chunk


def llamacpp_windows(tokens: np.ndarray, n_ctx: int, n_chunk: int, bos_id: int | None) -> list[Window]:
    """The chunks of llama-perplexity, in order; ``bos_id`` None means the model wants no BOS."""
    first = n_ctx // 2
    out = []
    for c in range(n_chunk):
        chunk = np.array(tokens[c * n_ctx:(c + 1) * n_ctx], dtype=np.int32)
        targets = chunk[first + 1:].astype(np.int64)
        if bos_id is not None:
            chunk[0] = bos_id
        out.append(Window(c, chunk, first, targets))
    return out


def describe_llamacpp(n_ctx: int) -> dict:
    return {"name": "llamacpp", "n_ctx": n_ctx, "scored_offsets": [n_ctx // 2, n_ctx - 2]}
