"""The numbers every base file carries, and what follows from them."""

from __future__ import annotations

from dataclasses import dataclass

from kldtool.codec import row_width

# Refuse headers that could not describe a real run before sizing anything from them.
MAX_CTX = 1 << 24
MAX_VOCAB = 1 << 24


@dataclass(frozen=True)
class BaseHeader:
    n_ctx: int
    n_vocab: int
    n_chunk: int

    @property
    def first(self) -> int:
        """Offset in a chunk of the first position whose prediction is scored."""
        return self.n_ctx // 2

    @property
    def rows_per_chunk(self) -> int:
        return self.n_ctx - 1 - self.first

    @property
    def row_width(self) -> int:
        return row_width(self.n_vocab)

    @property
    def chunk_nbytes(self) -> int:
        return self.rows_per_chunk * self.row_width * 2

    @property
    def n_tokens(self) -> int:
        return self.n_ctx * self.n_chunk

    def problems(self) -> list[str]:
        """Why these numbers cannot be a base file's (empty when they can)."""
        out = []
        if not 4 <= self.n_ctx <= MAX_CTX:
            out.append(f"n_ctx {self.n_ctx} outside [4, {MAX_CTX}]")
        if not 2 <= self.n_vocab <= MAX_VOCAB:
            out.append(f"n_vocab {self.n_vocab} outside [2, {MAX_VOCAB}]")
        if self.n_chunk < 1:
            out.append(f"n_chunk {self.n_chunk} < 1")
        return out
