"""Scoring protocols: pure functions from a token stream (or documents) to the windows an
engine evaluates, and which of their positions are scored (docs/protocols.md).

- ``llamacpp``: non-overlapping chunks of n_ctx tokens, the first replaced by BOS when the
  model wants one, predictions at offsets n_ctx/2 .. n_ctx-2 scored.
- ``exl3``: windows [a, a+L) for a = 0, S, 2S, ... (whole windows only), run cold, every
  position scored, so a token inside several windows counts several times.
- ``stride``: Hugging Face's fixed-length method: windows of at most L tokens every S tokens,
  each scoring only the tokens no earlier window scored (each token once, >= L-S context).
- ``documents``: each document on its own, its first N tokens, every position scored; for
  several N one window per document, its first max(N) tokens (a causal model's first N
  positions do not depend on what follows). A document shorter than N counts at N with all
  its tokens (Museformer's convention); with ``full_only`` it is skipped at that N instead.
- ``rolling``: lm-evaluation-harness's ``loglikelihood_rolling`` (rolling token windows with a
  context of one token, made disjoint): each document behind a prefix token, every token of it
  scored exactly once, in windows of L tokens. A window's last position is scored too (its
  target is the stream token right after the window), so no window is longer than lm-eval's.

A window's ``start`` is the offset of its first token in the stored token stream: windows
that overlap share tokens there, so a base file stores each token once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kldtool.errors import TextTooShort, UsageError

# llama-perplexity's chunks of -c, each scored on its second half (--protocol llamacpp).
HALF_SCORED_CHUNKS = "llamacpp"
PROTOCOLS = (HALF_SCORED_CHUNKS, "exl3", "stride", "documents", "rolling")


@dataclass(kw_only=True, frozen=True)
class Window:
    index: int  # window number, 0-based
    tokens: np.ndarray  # int32, exactly what the engine evaluates (BOS substituted)
    first: int  # offset of the first position whose logits are scored
    targets: np.ndarray  # int64 ids the scored positions predict (original tokens)
    start: int = 0  # offset of tokens[0] in the stored token stream

    @property
    def n_scored(self) -> int:
        return len(self.targets)

    @property
    def shape(self) -> tuple[int, int, int]:
        """Windows of one shape can share an engine call."""
        return len(self.tokens), self.first, self.n_scored

    def scored_positions(self) -> np.ndarray:
        """Stream offsets of the tokens this window's scored positions predict."""
        return self.start + self.first + 1 + np.arange(self.n_scored)

    @property
    def end(self) -> int:
        """Stream offset just past the last token the window reads or predicts."""
        return self.start + max(len(self.tokens), self.first + 1 + self.n_scored)


@dataclass(kw_only=True, frozen=True)
class Protocol:
    """A protocol and its parameters: ``n_ctx`` is llamacpp's chunk and exl3/stride/rolling's
    window length L (rolling: 0 until the model's context fills it in); ``stride`` is S;
    ``lengths`` are documents' N (empty: whole documents); ``full_only``: documents count at N
    only when they have N tokens (else a shorter one counts with all its tokens, the music
    evaluations' convention); ``prefix`` is rolling's prefix token (None: the model's BOS, else
    its EOS, as lm-eval picks it)."""

    name: str = HALF_SCORED_CHUNKS
    n_ctx: int = 512
    stride: int | None = None
    lengths: tuple[int, ...] = ()
    prefix: int | None = None
    full_only: bool = False

    @classmethod
    def from_flags(
        cls,
        name: str,
        ctx_size: int | None,
        stride: int | None,
        lengths: str | None,
        prefix: int | None = None,
        full_only: bool = False,
    ) -> "Protocol":
        if name not in PROTOCOLS:
            raise UsageError(f"--protocol {name!r}: expected one of {', '.join(PROTOCOLS)}")
        if name != "documents" and lengths is not None:
            raise UsageError(f"--lengths: only for --protocol documents, not {name}")
        if name in (HALF_SCORED_CHUNKS, "documents", "rolling") and stride is not None:
            raise UsageError(f"--stride: only for --protocol exl3 or stride, not {name}")
        if name != "rolling" and prefix is not None:
            raise UsageError(f"--prefix-token: only for --protocol rolling, not {name}")
        if full_only and (name != "documents" or lengths is None):
            raise UsageError("--full-length-only: only for --protocol documents with --lengths")
        if name == "rolling":
            if ctx_size is not None and ctx_size < 2:
                raise UsageError(f"--ctx-size {ctx_size}: a window needs at least 2 tokens")
            if prefix is not None and prefix < 0:
                raise UsageError(f"--prefix-token {prefix}: a token id is 0 or more")
            return cls(name=name, n_ctx=ctx_size or 0, stride=None, lengths=(), prefix=prefix)
        if name == "documents":
            if ctx_size is not None:
                raise UsageError("--ctx-size: --protocol documents takes --lengths N,N,... instead")
            return cls(name=name, n_ctx=0, stride=None, lengths=parse_lengths(lengths), full_only=full_only)
        n_ctx = 512 if ctx_size is None else ctx_size
        if name == HALF_SCORED_CHUNKS:
            if n_ctx < 4:
                raise UsageError(f"--ctx-size {n_ctx}: must be at least 4")
            return cls(name=name, n_ctx=n_ctx)
        if n_ctx < 2:
            raise UsageError(f"--ctx-size {n_ctx}: a window needs at least 2 tokens")
        s = n_ctx // 4 if stride is None else stride
        if not 1 <= s <= n_ctx:
            raise UsageError(f"--stride {s}: must be between 1 and the window length {n_ctx}")
        return cls(name=name, n_ctx=n_ctx, stride=s)

    @classmethod
    def from_metadata(cls, meta: dict) -> "Protocol":
        return cls(
            name=meta["name"],
            n_ctx=int(meta.get("n_ctx") or 0),
            stride=meta.get("stride"),
            lengths=tuple(int(n) for n in meta.get("lengths", ())),
            prefix=meta.get("prefix_id"),
            # Files written before the choice existed skipped shorter documents.
            full_only=meta.get("shorter_documents", "skipped") == "skipped" and bool(meta.get("lengths")),
        )

    def describe(self) -> dict:
        if self.name == HALF_SCORED_CHUNKS:
            return {
                "name": HALF_SCORED_CHUNKS,
                "n_ctx": self.n_ctx,
                "scored_offsets": [self.n_ctx // 2, self.n_ctx - 2],
            }
        if self.name == "documents":
            out = {"name": "documents", "lengths": list(self.lengths)}
            return out | ({"shorter_documents": "skipped" if self.full_only else "counted"} if self.lengths else {})
        if self.name == "rolling":
            return {
                "name": "rolling",
                "n_ctx": self.n_ctx,
                "prefix_id": self.prefix,
                "mirrors": "lm_eval loglikelihood_rolling (context_len 1, disjoint windows)",
            }
        return {"name": self.name, "n_ctx": self.n_ctx, "stride": self.stride}

    @property
    def counts_once(self) -> bool:
        """Whether every token (after the first, but for rolling) is scored exactly once (bits
        per byte apply)."""
        return self.name in ("stride", "rolling") or (self.name == "documents" and not self.lengths)


def parse_lengths(spec: str | None) -> tuple[int, ...]:
    if spec is None or spec.strip() in ("", "all"):
        return ()
    try:
        lengths = tuple(sorted({int(x) for x in spec.split(",") if x.strip()}))
    except ValueError:
        lengths = (0,)
    if not lengths or lengths[0] < 2:
        raise UsageError(f"--lengths {spec}: expected token counts of at least 2, e.g. 1024,5120")
    return lengths


def limit(windows: list[Window], chunks: int | None) -> list[Window]:
    if chunks is None:
        return windows
    if chunks < 1:
        raise UsageError(f"--chunks {chunks}: must be at least 1")
    return windows[:chunks]


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
        chunk = np.array(tokens[c * n_ctx : (c + 1) * n_ctx], dtype=np.int32)
        targets = chunk[first + 1 :].astype(np.int64)
        if bos_id is not None:
            chunk[0] = bos_id
        out.append(Window(index=c, tokens=chunk, first=first, targets=targets, start=c * n_ctx))
    return out


def _span(tokens: np.ndarray, index: int, start: int, end: int, first: int, n_scored: int | None = None) -> Window:
    """The window tokens[start:end] scoring offsets first .. end-start-2, or ``n_scored`` of
    them from first on (rolling also scores the last, predicting tokens[end]); no BOS substitution."""
    w = np.array(tokens[start:end], dtype=np.int32)
    n = len(w) - first - 1 if n_scored is None else n_scored
    at = start + first + 1
    return Window(
        index=index, tokens=w, first=first, targets=np.asarray(tokens[at : at + n], dtype=np.int64), start=start
    )


def exl3_windows(tokens: np.ndarray, length: int, stride: int) -> list[Window]:
    n = len(tokens)
    if n < length:
        raise TextTooShort(
            f"the text tokenizes to {n} tokens; a window of --ctx-size {length} needs at least that many"
        )
    return [_span(tokens, i, a, a + length, 0) for i, a in enumerate(range(0, n - length + 1, stride))]


def stride_windows(tokens: np.ndarray, length: int, stride: int) -> list[Window]:
    n = len(tokens)
    if n < 2:
        raise TextTooShort(f"the text tokenizes to {n} token(s); at least 2 are needed")
    out, prev_end = [], 0
    for begin in range(0, n, stride):
        end = min(begin + length, n)
        # The window predicts tokens begin+1 .. end-1; those at or after prev_end are new.
        first = max(prev_end, begin + 1) - begin - 1
        out.append(_span(tokens, len(out), begin, end, first))
        prev_end = end
        if end == n:
            break
    return out


@dataclass(frozen=True, kw_only=True)
class Documents:
    """Documents laid end to end in one stream, each cut to the longest length it is used at."""

    stream: np.ndarray  # int32
    windows: list[Window]
    n_documents: int  # all documents of the corpus, the skipped ones included
    doc_lengths: np.ndarray  # tokens of every document before truncation
    sources: list[int] | None = None  # each window's document (documents protocol)


def document_windows(
    docs: list[np.ndarray], lengths: tuple[int, ...], full_only: bool = True, firsts: list[int] | None = None
) -> Documents:
    """Each document cut to the longest length it counts at: with ``full_only``, the longest N
    it reaches (none: skipped); else its first max(N) tokens, all of a shorter one. ``firsts``:
    each document's first scored position (a generated sample's answer; default 0); a document
    with no scored position left after the cut is skipped."""
    sizes = np.array([len(d) for d in docs], dtype=np.int64)
    parts, windows, sources, at = [], [], [], 0
    for k, d in enumerate(docs):
        if not lengths:
            keep = len(d)
        elif full_only:
            keep = max((n for n in lengths if n <= len(d)), default=0)
        else:
            keep = min(len(d), lengths[-1])
        first = firsts[k] if firsts is not None else 0
        if keep < 2 or first + 1 >= keep:
            continue
        w = np.array(d[:keep], dtype=np.int32)
        parts.append(w)
        windows.append(
            Window(index=len(windows), tokens=w, first=first, targets=w[first + 1 :].astype(np.int64), start=at)
        )
        sources.append(k)
        at += keep
    if not windows:
        need = lengths[0] if lengths and full_only else 2
        raise TextTooShort(
            f"no document has {need} tokens or more ({len(docs)} documents, "
            f"longest {int(sizes.max()) if len(sizes) else 0} tokens)"
        )
    stream = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return Documents(stream=stream, windows=windows, n_documents=len(docs), doc_lengths=sizes, sources=sources)


def rolling_windows(docs: list[np.ndarray], length: int, prefix: int) -> Documents:
    """lm-eval's rolling windows, each document stored behind ``prefix``: the first window is
    the prefix and the document's first L-1 tokens, predicting its first L; each later one
    predicts the next L tokens (fewer at the end) from the L tokens before them."""
    sizes = np.array([len(d) for d in docs], dtype=np.int64)
    kept = [d for d in docs if len(d)]  # lm-eval scores nothing of an empty document
    if not kept:
        raise TextTooShort(f"no document has a token ({len(docs)} documents)")
    stream = np.concatenate([np.concatenate(([prefix], d)) for d in kept]).astype(np.int32)
    windows: list[Window] = []
    at = 0  # the stream offset of the document's prefix
    for d in kept:
        n = len(d)
        m = min(length, n)
        windows.append(_span(stream, len(windows), at, at + m, 0, m))
        while m < n:
            k = min(n - m, length)
            end = at + m + k  # the window ends right before its last target, document token m+k-1
            windows.append(_span(stream, len(windows), end - length, end, length - k, k))
            m += k
        at += n + 1
    return Documents(stream=stream, windows=windows, n_documents=len(docs), doc_lengths=sizes)


def windows_from_table(stream: np.ndarray, table) -> list[Window]:
    """Windows as a base file stores them: rows of (start, length, first, n_scored), already
    checked to fit the stream (scoring offsets first .. length-2, or through length-1)."""
    return [_span(stream, i, start, start + length, first, n) for i, (start, length, first, n) in enumerate(table)]


def window_table(windows: list[Window]) -> tuple[tuple[int, int, int, int], ...]:
    return tuple((int(w.start), len(w.tokens), w.first, w.n_scored) for w in windows)


def stored_windows(tokens: np.ndarray, header, bos_id: int | None) -> list[Window]:
    """The windows a base file was written with: llama.cpp's chunks (BOS substituted as a model
    wants) when its header has no window table, else that table's."""
    if header.windows is None:
        return llamacpp_windows(tokens, header.n_ctx, header.n_chunk, bos_id)
    return windows_from_table(tokens, header.windows)
