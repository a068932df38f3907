"""Text corpora, read the way llama-perplexity reads ``-f``: raw bytes, CR kept, one trailing
newline dropped. The built-in default is the Python standard library's own help text."""

from __future__ import annotations

import os

from kldtool.errors import CorpusError, EmptyText, UndecodableText

DEFAULT_CORPUS_NAME = "builtin:pydoc_data.topics"


def read_text_file(path: str | os.PathLike) -> bytes:
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CorpusError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise CorpusError(f"{p}: is a directory; give a text file") from None
    except OSError as e:
        raise CorpusError(f"{p}: cannot read ({e.strerror})") from None
    if data.endswith(b"\n"):
        data = data[:-1]
    if not data.strip():
        raise EmptyText(f"{p}: empty text")
    check_utf8(data, p)
    return data


def check_utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UndecodableText(
            f"{where}: bytes at offset {e.start} are not valid UTF-8 ({data[e.start:e.start + 4]!r}); "
            "convert the file to UTF-8"
        ) from None


def default_corpus() -> tuple[str, bytes]:
    """The pydoc topics that ship with every CPython: real English prose and code, ~1 MB."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return DEFAULT_CORPUS_NAME, text.encode("utf-8")


def load_corpus(path: str | None) -> tuple[str, bytes]:
    if path is None:
        return default_corpus()
    return os.fspath(path), read_text_file(path)
