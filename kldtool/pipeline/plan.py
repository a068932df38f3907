"""From a corpus, a protocol and an engine's tokenizer to the windows a run evaluates and the
token stream a base file stores (shared by ``base``, ``ppl`` and, through the file, ``compare``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from kldtool.text.corpus import Corpus
from kldtool.errors import ContextTooLong, UsageError
from kldtool.text.protocols import (
    HALF_SCORED_CHUNKS,
    Protocol,
    Window,
    document_windows,
    exl3_windows,
    limit,
    llamacpp_chunk_count,
    llamacpp_windows,
    rolling_windows,
    stride_windows,
)

# lm-eval's max_length when neither the model's config nor its tokenizer names one.
LMEVAL_DEFAULT_LENGTH = 2048


@dataclass(kw_only=True)
class Plan:
    protocol: Protocol
    stream: np.ndarray  # int32: every window's tokens, each stored once
    windows: list[Window]
    n_source_tokens: int  # tokens of the corpus before any cut
    documents: dict = field(default_factory=dict)  # documents: counts per length
    text_size: dict | None = None  # bytes and words the scored tokens cover (bits per byte)
    scored: str | None = None  # "generated": only a generated corpus's answers are scored
    finish: list | None = None  # a generated corpus's windows: why each answer ended

    @property
    def n_ctx(self) -> int:
        """The longest window: what engines size their batches and contexts for."""
        return max(len(w.tokens) for w in self.windows)

    def describe(self, bos_id: int | None) -> dict:
        out = self.protocol.describe() | {"bos_id": bos_id, "windows": len(self.windows)}
        if self.documents:
            out["documents"] = self.documents
        if self.scored:
            out["scored"] = self.scored
        return out


def make_plan(engine, corpus: Corpus, protocol: Protocol, chunks: int | None, force: bool = False) -> Plan:
    if corpus.score_from is not None and protocol.name != "documents":
        raise UsageError(
            f"--protocol {protocol.name}: {corpus.name} is kldtool generate's, scored by its samples' answers as "
            "documents (--protocol documents); --score all scores it as any token stream"
        )
    if protocol.name == "documents":
        plan = _documents_plan(engine, corpus, protocol, chunks)
        _check_context(engine, plan.n_ctx, f"documents cut to {plan.n_ctx} tokens (--lengths)", force)
        return plan
    if protocol.name == "rolling":
        protocol = rolling_protocol(engine, protocol)
        _check_context(engine, protocol.n_ctx, f"--ctx-size {protocol.n_ctx}", force)
        return _rolling_plan(engine, corpus, protocol, chunks)
    _check_context(engine, protocol.n_ctx, f"--ctx-size {protocol.n_ctx}", force)  # before tokenizing a long text
    return _stream_plan(engine, corpus, protocol, chunks)


def _documents_plan(engine, corpus: Corpus, p: Protocol, chunks: int | None) -> Plan:
    firsts = [n - 1 for n in corpus.score_from] if corpus.score_from is not None else None  # P-1 predicts P
    docs = document_windows(corpus.document_tokens(engine), p.lengths, p.full_only, firsts)
    windows = limit(docs.windows, chunks)
    end = windows[-1].end
    lens = docs.doc_lengths
    per_length = {}
    for n in p.lengths:
        used = sum(1 for w in windows if counts_at(p, w, n))
        per_length[str(n)] = {"used": used, "shorter": int((lens < n).sum()), "skipped": docs.n_documents - used}
    counts = {"total": docs.n_documents, "per_length": per_length}
    whole = p.counts_once and len(windows) == len(corpus.documents)
    return Plan(
        protocol=p,
        stream=docs.stream[:end],
        windows=windows,
        n_source_tokens=int(lens.sum()),
        documents=counts,
        text_size=corpus.size(whole_stream=False) if whole else None,
        scored="generated" if firsts is not None else None,
        finish=[corpus.finish[k] for k in docs.sources[: len(windows)]] if corpus.finish else None,
    )


def counts_at(p: Protocol, w, n: int) -> bool:
    """Whether document window ``w`` counts at length ``n`` (its first ``n`` tokens, or all of a
    shorter one unless the protocol takes only full-length documents)."""
    return not p.full_only or len(w.tokens) >= n


def rolling_protocol(engine, p: Protocol) -> Protocol:
    """Fill in what rolling takes from the model: the window (its trained context, lm-eval's
    default max_length) and the prefix token (BOS, else EOS, as lm-eval's prefix_token_id)."""
    n_ctx = p.n_ctx or engine.facts.n_ctx_train or LMEVAL_DEFAULT_LENGTH
    prefix = p.prefix if p.prefix is not None else engine.facts.prefix_id
    if prefix is None:
        raise UsageError(
            f"--protocol rolling: {engine.facts.model} has no BOS or EOS token to put "
            "before each document; give --prefix-token ID"
        )
    if prefix >= engine.facts.n_vocab:
        raise UsageError(f"--prefix-token {prefix}: outside the vocabulary of {engine.facts.n_vocab}")
    return replace(p, n_ctx=n_ctx, prefix=prefix)


def _rolling_plan(engine, corpus: Corpus, p: Protocol, chunks: int | None) -> Plan:
    docs = rolling_windows(corpus.document_tokens(engine), p.n_ctx, p.prefix)
    windows = limit(docs.windows, chunks)
    whole = len(windows) == len(docs.windows)
    return Plan(
        protocol=p,
        stream=docs.stream[: windows[-1].end],
        windows=windows,
        n_source_tokens=int(docs.doc_lengths.sum()),
        documents={"total": docs.n_documents},
        text_size=corpus.size(whole_stream=False) if whole else None,
    )


def _stream_plan(engine, corpus: Corpus, p: Protocol, chunks: int | None) -> Plan:
    stream = corpus.stream(engine)
    if p.name == HALF_SCORED_CHUNKS:
        n_chunk = llamacpp_chunk_count(len(stream), p.n_ctx, chunks)
        windows = llamacpp_windows(stream, p.n_ctx, n_chunk, engine.facts.bos_id)
    else:
        made = (exl3_windows if p.name == "exl3" else stride_windows)(stream, p.n_ctx, p.stride)
        windows = limit(made, chunks)
    end = windows[-1].end
    whole = p.counts_once and end == len(stream)
    return Plan(
        protocol=p,
        stream=stream[:end],
        windows=windows,
        n_source_tokens=len(stream),
        documents={},
        text_size=corpus.size(whole_stream=True) if whole else None,
    )


def _check_context(engine, n_ctx: int, what: str, force: bool) -> None:
    n_train = engine.facts.n_ctx_train
    if n_train and n_ctx > n_train and not force:
        raise ContextTooLong(
            f"{what}: windows of {n_ctx} tokens exceed the model's context of {n_train} (--force runs them anyway)"
        )
