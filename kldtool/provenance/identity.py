"""What makes two runs' numbers comparable: the identity of a base file (header, tokens,
window table) and of a model as an engine described it. Shared by the run layer (resume,
shards, merge) and the results layer (report), which must agree on it."""

from __future__ import annotations

import hashlib
import os
import weakref

import numpy as np

from kldtool.codec.rows import DEFAULT_CLAMP


def base_identity(reader) -> dict:
    """What makes two base files interchangeable: the header and the tokens (not the path or
    the format: a converted copy holds the same codes)."""
    h = reader.header
    out = {
        "n_ctx": h.n_ctx,
        "n_vocab": h.n_vocab,
        "n_chunk": h.n_chunk,
        "tokens_sha256": hashlib.sha256(np.ascontiguousarray(reader.tokens, "<i4").tobytes()).hexdigest(),
    }
    if h.keep:  # a top-K file of the same run gives other (lower-bound) KLDs
        out["keep"] = h.keep
    if h.clamp != DEFAULT_CLAMP:  # a wider window counts more entries
        out["clamp"] = h.clamp
    if h.windows is not None:  # one stream can be cut into windows in many ways
        out["windows_sha256"] = hashlib.sha256(np.array(h.windows, dtype="<i8").tobytes()).hexdigest()
    return out


def model_identity(described: dict, full_path: bool = True) -> dict:
    """The parts of an engine's description that change the numbers. Shards may come from
    machines with other paths, so merging compares only the model's file or directory name."""
    model = str(described.get("model"))
    out = {
        "engine": described.get("engine"),
        "dtype": described.get("dtype"),
        "model": model if full_path else os.path.basename(model.rstrip("/")),
    }
    # llama.cpp's attention settings where they are not its defaults: a q4_0 KV cache is another
    # configuration of the same GGUF (report ranks them side by side; resume keeps them apart).
    if described.get("kv_cache") not in (None, "f16"):
        out["kv_cache"] = described["kv_cache"]
    if described.get("flash_attn") == "off":
        out["flash_attn"] = "off"
    return out


_TOKENIZERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def tokenizer_identity(engine) -> str:
    """sha256 over an engine's token texts, NUL-separated: equal vocabularies hash equal across
    engines. Computed once per engine (a 262k vocabulary's texts take a while to list)."""
    cached = _TOKENIZERS.get(engine)
    if cached is None:
        texts = list(engine.token_strings())  # one update: the same digest as one per text
        digest = hashlib.sha256(b"\0".join(texts) + b"\0" if texts else b"").hexdigest()
        cached = _TOKENIZERS[engine] = "sha256:" + digest
    return cached
