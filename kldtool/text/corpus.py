"""Corpora: plain text (read as llama-perplexity reads ``-f``: raw bytes, CR kept, one
trailing newline dropped), one document per line, JSONL with a text field, a directory of
files, pretokenized files (whitespace-separated token strings of the model's vocabulary,
or integer ids; one document per line), a raw WikiText file paged and detokenized as
lm-eval's ``wikitext`` task reads it, and a model's own samples (``kldtool generate``'s corpus,
text/generated.py: recognised by its header). The built-in default is the Python standard library's
own help text.

Stream protocols see a text corpus's documents joined by a blank line and tokenized once
(a single text file is exactly its bytes); pretokenized documents are laid end to end as given.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kldtool.errors import CorpusError, EmptyText, UndecodableText, UsageError
from kldtool.text.generated import is_generated, read_generated

DEFAULT_CORPUS_NAME = "builtin:pydoc_data.topics"
FORMATS = ("auto", "text", "lines", "jsonl", "dir", "tokens", "ids", "wikitext", "generated")
PRETOKENIZED = ("tokens", "ids", "generated")
SCORES = ("generated", "all")  # a generated corpus's positions scored: the answers' only, or every one
JOIN = b"\n\n"


@dataclass(kw_only=True)
class Corpus:
    name: str
    format: str
    documents: list  # bytes per document; str lists (tokens) or int arrays (ids) when pretokenized
    counted: list | None = None  # bytes per document that words and bytes are counted on, if not the scored
    score_from: list | None = None  # generated corpora: each document's first generated token (None: all scored)
    finish: list | None = None  # generated corpora: why each answer ended ("stop", "length")

    @property
    def pretokenized(self) -> bool:
        return self.format in PRETOKENIZED

    def text(self) -> bytes:
        return JOIN.join(self.documents)

    def stream(self, engine) -> np.ndarray:
        if self.pretokenized:
            return np.concatenate(self.document_tokens(engine))
        return engine.tokenize(self.text())

    def document_tokens(self, engine) -> list[np.ndarray]:
        if not self.pretokenized:
            return [engine.tokenize(d) for d in self.documents]
        if self.format in ("ids", "generated"):
            docs = self.documents
        else:
            vocab = {t.decode("utf-8", "replace"): i for i, t in enumerate(engine.token_strings())}
            docs = [_map_tokens(d, vocab, self.name, line) for line, d in self.documents]
        for line, d in enumerate(docs, 1):
            bad = np.nonzero((d < 0) | (d >= engine.facts.n_vocab))[0]
            if bad.size:
                raise CorpusError(
                    f"{self.name}: document {line}: id {int(d[bad[0]])} is outside the vocabulary of {engine.facts.n_vocab}"
                )
        return [np.asarray(d, dtype=np.int32) for d in docs]

    def longest_document(self) -> int | None:
        """The longest document in tokens where that is known before tokenizing (ids)."""
        if self.format not in ("ids", "generated") or not self.documents:
            return None
        return max(len(d) for d in self.documents)

    def size(self, whole_stream: bool) -> dict | None:
        """Bytes and words of the text as lm-eval counts them (words: re.split(r"\\s+")), for
        bits per byte and word perplexity; None for pretokenized corpora."""
        if self.pretokenized:
            return None
        parts = self.counted or self.documents
        parts = [JOIN.join(parts)] if whole_stream else parts
        return {
            "bytes": sum(len(p) for p in parts),
            "words": sum(len(re.split(r"\s+", p.decode("utf-8"))) for p in parts),
        }


def _map_tokens(strings: list[str], vocab: dict, where: str, line: int) -> np.ndarray:
    try:
        return np.array([vocab[s] for s in strings], dtype=np.int64)
    except KeyError as e:
        raise CorpusError(f"{where}: line {line}: token {e.args[0]!r} is not in the model's vocabulary") from None


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise CorpusError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CorpusError(f"{path}: is a directory; give a text file or --corpus-format dir") from None
    except OSError as e:
        raise CorpusError(f"{path}: cannot read ({e.strerror})") from None


def read_text_file(path: str | os.PathLike) -> bytes:
    p = os.fspath(path)
    data = _read(p)
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
            f"{where}: bytes at offset {e.start} are not valid UTF-8 ({data[e.start : e.start + 4]!r}); "
            "convert the file to UTF-8"
        ) from None


def default_corpus() -> tuple[str, bytes]:
    """The pydoc topics that ship with every CPython: real English prose and code, ~1 MB."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return DEFAULT_CORPUS_NAME, text.encode("utf-8")


def guess_format(path: str) -> str:
    if os.path.isdir(path):
        return "dir"
    return "jsonl" if Path(path).suffix.lower() in (".jsonl", ".ndjson") else "text"


def _lines(path: str) -> list[tuple[int, str]]:
    data = _read(path)
    text = check_utf8(data, path)
    return [(i, line) for i, line in enumerate(text.split("\n"), 1) if line.strip()]


def _jsonl(path: str, field: str) -> list[bytes]:
    docs = []
    for i, line in _lines(path):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusError(f"{path}: line {i} is not JSON ({e.msg} at column {e.colno})") from None
        value = rec.get(field) if isinstance(rec, dict) else None
        if not isinstance(value, str):
            raise CorpusError(f"{path}: line {i} has no string field {field!r} (--text-field names it)")
        if value.strip():
            docs.append(value.encode("utf-8"))
    return docs


def _directory(path: str) -> list[bytes]:
    files = sorted(p for p in Path(path).iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise EmptyText(f"{path}: no files in the directory")
    docs = []
    for f in files:
        data = _read(str(f))
        check_utf8(data, str(f))
        if data.strip():
            docs.append(data[:-1] if data.endswith(b"\n") else data)
    return docs


def _ids(path: str) -> list[np.ndarray]:
    docs = []
    for i, line in _lines(path):
        try:
            docs.append(np.array([int(x) for x in line.split()], dtype=np.int64))
        except ValueError:
            bad = next(x for x in line.split() if not x.lstrip("-").isdigit())
            raise CorpusError(f"{path}: line {i}: {bad!r} is not a token id (--corpus-format ids)") from None
    return docs


def open_corpus(path: str | None, fmt: str = "auto", text_field: str = "text", score: str | None = None) -> Corpus:
    """The corpus at ``path`` (None: the built-in one) read as ``fmt``; ``score``: which positions
    of a generated corpus are scored (default: the generated ones)."""
    if fmt not in FORMATS:
        raise UsageError(f"--corpus-format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if score is not None and score not in SCORES:
        raise UsageError(f"--score {score!r}: expected one of {', '.join(SCORES)}")
    generated = path is not None and (fmt == "generated" or (fmt == "auto" and is_generated(os.fspath(path))))
    if score is not None and not generated:
        raise UsageError(f"--score {score}: only for a corpus of kldtool generate")
    if generated:
        return _generated(os.fspath(path), score or "generated")
    if path is None:
        if fmt not in ("auto", "text"):
            raise UsageError(f"--corpus-format {fmt} needs -f FILE")
        name, text = default_corpus()
        return Corpus(name=name, format="text", documents=[text])
    p = os.fspath(path)
    fmt = guess_format(p) if fmt == "auto" else fmt
    if fmt == "text":
        docs = [read_text_file(p)]
    elif fmt == "lines":
        docs = [line.encode("utf-8") for _, line in _lines(p)]
    elif fmt == "jsonl":
        docs = _jsonl(p, text_field)
    elif fmt == "dir":
        if not os.path.isdir(p):
            raise CorpusError(f"{p}: not a directory (--corpus-format dir)")
        docs = _directory(p)
    elif fmt == "tokens":
        docs = [(i, line.split()) for i, line in _lines(p)]
    elif fmt == "wikitext":
        return _wikitext(p)
    else:
        docs = _ids(p)
    if not docs:
        raise EmptyText(f"{p}: no documents ({fmt})")
    return Corpus(name=p, format=fmt, documents=docs)


def _generated(path: str, score: str) -> Corpus:
    """A corpus of ``kldtool generate``: each sample a document, its prompt and its answer."""
    _, samples = read_generated(path)
    docs = [np.concatenate([s["prompt_ids"], s["ids"]]) for s in samples]
    starts = [len(s["prompt_ids"]) for s in samples] if score == "generated" else None
    finish = [s["finish"] for s in samples]
    return Corpus(name=path, format="generated", documents=docs, score_from=starts, finish=finish)


def _wikitext(path: str) -> Corpus:
    from kldtool.text import wikitext

    data = _read(path)
    found = wikitext.pages(check_utf8(data, path))
    if not found:
        raise EmptyText(f"{path}: no WikiText articles (--corpus-format wikitext)")
    return Corpus(
        name=path,
        format="wikitext",
        documents=[wikitext.detokenize(p).encode("utf-8") for p in found],
        counted=[p.encode("utf-8") for p in found],
    )
