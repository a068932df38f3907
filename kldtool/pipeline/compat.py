"""Whether a model belongs to a base file (vocabulary, tokenizer, BOS, context), and the windows
and protocol the file was written with: compare takes both from the file."""

from __future__ import annotations

from kldtool.errors import ContextTooLong, TokenizerMismatch, VocabMismatch
from kldtool.provenance.identity import tokenizer_identity
from kldtool.provenance.manifest import backend_change
from kldtool.text.protocols import HALF_SCORED_CHUNKS, Window, stored_windows


def check_compatible(engine, reader, force: bool) -> list[str]:
    """Refuse a model that does not belong to the base file; returns warnings: what --force
    kept, and a llama.cpp backend other than the base file's."""
    h, meta, where = reader.header, reader.metadata, reader.path
    if engine.facts.n_vocab != h.n_vocab:
        raise VocabMismatch(f"{where}: base file has a vocabulary of {h.n_vocab}, the model {engine.facts.n_vocab}")
    warnings = []
    n_train = engine.facts.n_ctx_train
    if n_train and h.n_ctx > n_train:
        # as base and ppl: --force runs past the trained context (a memory or speed test)
        msg = f"{where}: chunks of {h.n_ctx} tokens exceed the model's context of {n_train}"
        if not force:
            raise ContextTooLong(msg + "; --force compares anyway")
        warnings.append("FORCED: " + msg)
    stored = meta.get("tokenizer_identity")
    if stored is not None and stored != tokenizer_identity(engine):
        msg = (
            f"{where}: tokenizer differs from the base model's (identity {stored[:19]}... vs "
            f"{tokenizer_identity(engine)[:19]}...)"
        )
        if not force:
            raise TokenizerMismatch(msg + "; --force compares anyway")
        warnings.append("FORCED: " + msg)
    stored_bos = meta.get("protocol", {}).get("bos_id", engine.facts.bos_id)
    if stored_bos != engine.facts.bos_id:
        msg = (
            f"{where}: the base model {'replaced each chunk start by BOS ' + str(stored_bos) if stored_bos is not None else 'used no BOS'}"
            f", this model {'wants BOS ' + str(engine.facts.bos_id) if engine.facts.bos_id is not None else 'wants none'}"
        )
        if not force:
            raise TokenizerMismatch(msg + "; --force compares anyway")
        warnings.append("FORCED: " + msg)
    changed = backend_change(meta.get("manifest"), engine.facts)
    if changed:
        warnings.append(f"{where}: {changed}")
    return warnings


def base_windows(reader, bos_id: int | None) -> list[Window]:
    """The windows the base file was written with: llama.cpp's chunks (BOS substituted as
    this model wants), or the file's own window table."""
    return stored_windows(reader.tokens, reader.header, bos_id)


def file_protocol(reader) -> dict:
    return reader.metadata.get("protocol") or {"name": HALF_SCORED_CHUNKS, "n_ctx": reader.header.n_ctx}
