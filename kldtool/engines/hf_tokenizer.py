"""Tokenization through a Hugging Face tokenizer, shared by the transformers and vLLM engines."""

from __future__ import annotations

import numpy as np


def bos_to_substitute(tokenizer) -> int | None:
    """The BOS id when the tokenizer puts one first (llama.cpp's add_bos), else None."""
    probe = tokenizer("a", add_special_tokens=True)["input_ids"]
    bos = tokenizer.bos_token_id
    return bos if bos is not None and probe and probe[0] == bos else None


def prefix_token(tokenizer) -> int | None:
    """lm-eval's prefix_token_id: the tokenizer's BOS, else its EOS."""
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


def tokenize(tokenizer, text: bytes, bos_id: int | None) -> np.ndarray:
    """Whole text, special tokens added as the tokenizer asks, but never a trailing EOS."""
    ids = tokenizer(text.decode("utf-8"), add_special_tokens=True)["input_ids"]
    eos = tokenizer.eos_token_id
    if ids and eos is not None and ids[-1] == eos and bos_id != eos:
        ids = ids[:-1]
    return np.asarray(ids, dtype=np.int32)


def token_strings(tokenizer, n_vocab: int):
    """Token texts in id order, padded with empty strings up to the model's vocabulary size."""
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    for i in range(n_vocab):
        t = vocab[i] if i < len(vocab) else None
        yield (t or "").encode("utf-8")
