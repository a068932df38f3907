"""What both base-file readers share: the open descriptor, error wording, the token table."""

from __future__ import annotations

import os

import numpy as np

from kldtool.errors import BaseFileError, CorruptData
from kldtool.logitsfile.header import BaseHeader


class BaseFileReader:
    format_name = "?"
    header: BaseHeader
    metadata: dict

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.fd = os.open(self.path, os.O_RDONLY)
        try:
            self.file_size = os.fstat(self.fd).st_size
            self._parse()
        except BaseException:
            self.close()
            raise

    def _parse(self) -> None:
        raise NotImplementedError

    def _fail(self, msg: str, cls: type[BaseFileError] = BaseFileError):
        raise cls(f"{self.path}: {msg}")

    def _read_tokens(self, offset: int) -> np.ndarray:
        """The int32 token table at ``offset``, every id checked against the vocabulary."""
        h = self.header
        tokens = np.frombuffer(os.pread(self.fd, 4 * h.n_tokens, offset), dtype="<i4").astype(np.int32)
        bad = np.nonzero((tokens < 0) | (tokens >= h.n_vocab))[0]
        if bad.size:
            i = int(bad[0])
            self._fail(f"token {int(tokens[i])} at offset {offset + 4 * i} (chunk {i // h.n_ctx}) "
                       f"is outside the vocabulary of {h.n_vocab}", CorruptData)
        return tokens

    def read_chunk(self, index: int) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
