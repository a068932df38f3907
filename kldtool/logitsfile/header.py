"""The numbers every base file carries, and what follows from them.

llama.cpp's chunks are uniform: n_chunk windows of n_ctx tokens laid end to end, each scoring
the same rows. Other protocols' windows overlap or vary in length: their files carry a window
table of (start in the token stream, length, first scored offset, scored rows) per window, and
the stream they index (n_stream tokens); n_ctx is then the longest window.
"""

from __future__ import annotations

from dataclasses import dataclass

from kldtool.codec import DEFAULT_CLAMP, row_width
from kldtool.codec.topk_records import topk_width

# Refuse headers that could not describe a real run before sizing anything from them.
# The two layouts, by the names --format takes: llama.cpp's raw file and kldtool's container.
RAW_LAYOUT, CONTAINER = "llamacpp", "kldtool"
MAX_CTX = 1 << 24
MAX_VOCAB = 1 << 24

WindowRow = tuple[int, int, int, int]  # start, length, first, n_scored


def rows_width(n_vocab: int, keep: int | None) -> int:
    """uint16 slots of one stored row: a full row, or a top-``keep`` record."""
    return topk_width(keep) if keep else row_width(n_vocab)


@dataclass(kw_only=True, frozen=True)
class BaseHeader:
    n_ctx: int
    n_vocab: int
    n_chunk: int
    windows: tuple[WindowRow, ...] | None = None  # None: llama.cpp's uniform chunks
    n_stream: int | None = None
    keep: int | None = None  # compact rows of the K most probable entries (codec/topk_records.py); None: full rows
    clamp: float = DEFAULT_CLAMP  # nats below each row's top that its codes span (codec/rows.py)

    @property
    def clamped_at(self) -> float:
        """Base entries at or below this log-prob count as clamped (llama.cpp: -16)."""
        return -self.clamp

    @property
    def first(self) -> int:
        """Offset in a llama.cpp chunk of the first position whose prediction is scored."""
        return self.n_ctx // 2

    @property
    def rows_per_chunk(self) -> int:
        """Rows of a llama.cpp chunk; with a window table, of the largest window."""
        if self.windows is not None:
            return max(w[3] for w in self.windows)
        return self.n_ctx - 1 - self.first

    def rows_of(self, index: int) -> int:
        return self.windows[index][3] if self.windows is not None else self.rows_per_chunk

    @property
    def row_width(self) -> int:
        return rows_width(self.n_vocab, self.keep)

    @property
    def chunk_nbytes(self) -> int:
        """Bytes of the largest chunk's rows."""
        return self.rows_per_chunk * self.row_width * 2

    @property
    def scored_tokens(self) -> int:
        if self.windows is not None:
            return sum(w[3] for w in self.windows)
        return self.rows_per_chunk * self.n_chunk

    @property
    def n_tokens(self) -> int:
        return self.n_stream if self.windows is not None else self.n_ctx * self.n_chunk

    def problems(self) -> list[str]:
        """Why these numbers cannot be a base file's (empty when they can)."""
        out = []
        lowest = 1 if self.windows is not None else 4
        if not lowest <= self.n_ctx <= MAX_CTX:
            out.append(f"n_ctx {self.n_ctx} outside [{lowest}, {MAX_CTX}]")
        if not 2 <= self.n_vocab <= MAX_VOCAB:
            out.append(f"n_vocab {self.n_vocab} outside [2, {MAX_VOCAB}]")
        if self.n_chunk < 1:
            out.append(f"n_chunk {self.n_chunk} < 1")
        if self.windows is not None and not out:
            if self.n_stream is None or not 0 < self.n_stream <= MAX_CTX * self.n_chunk:
                out.append(f"token stream of {self.n_stream} tokens")
            for i, (start, length, first, n) in enumerate(self.windows):
                # Offsets first .. length-2 are scored, or through length-1 (rolling), whose
                # target is the stream token after the window.
                if not (
                    0 <= start
                    and start + max(length, first + n + 1) <= (self.n_stream or 0)
                    and 1 <= length <= self.n_ctx
                    and 0 <= first
                    and n >= 1
                    and length - 1 <= first + n <= length
                ):
                    out.append(
                        f"window {i} (start {start}, length {length}, first {first}, rows {n}) does not "
                        f"fit the stream of {self.n_stream} tokens and n_ctx {self.n_ctx}, or does not "
                        f"score offsets first .. length-2 (or length-1)"
                    )
                    break
        return out
