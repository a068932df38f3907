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


def _gguf_split(path: str) -> tuple[str, dict]:
    """(directory, {"gguf_file": name}) for a GGUF file, else (path, {})."""
    import os

    if path.lower().endswith(".gguf") and os.path.isfile(path):
        return os.path.dirname(os.path.abspath(path)), {"gguf_file": os.path.basename(path)}
    return path, {}


class ServedTokenizer:
    """The tokenizer of a model served elsewhere, loaded here from its directory or hub id (a
    server's client needs neither the weights nor the server's machine): the tokenizer and what
    the model's config says of its context and vocabulary."""

    def __init__(self, path: str):
        from kldtool.errors import EngineError

        try:
            from transformers import AutoConfig, AutoTokenizer

            where = _gguf_split(path)  # a GGUF's own tokenizer, BOS policy included
            self.tokenizer = AutoTokenizer.from_pretrained(where[0], **where[1])
            config = AutoConfig.from_pretrained(where[0], **where[1])
        except Exception as e:
            raise EngineError(
                f"{path}: cannot load the served model's tokenizer here ({type(e).__name__}); give its directory with -m"
            ) from None
        text_config = getattr(config, "get_text_config", lambda: config)()
        self.n_ctx_train = getattr(text_config, "max_position_embeddings", None)
        self.n_vocab = getattr(text_config, "vocab_size", None)
        self.path = path
        self.bos_id = bos_to_substitute(self.tokenizer)
        self.prefix_id = prefix_token(self.tokenizer)


def served_tokenizer(given: str | None, entry: dict) -> ServedTokenizer:
    """The tokenizer of the model a server lists as ``entry`` (one item of /v1/models): the
    directory or hub id ``given`` (-m), else the path or id the server reports, from this
    machine's hub cache where it is a hub id. The name comes from the server, so nothing of its
    weights is downloaded on its word (transformers fetches a tokenizer's own files as usual)."""
    from kldtool.provenance import model_ref
    from kldtool.errors import EngineError

    named = given or entry.get("root") or entry["id"]
    try:
        named = model_ref.local_path(named, cached_only=True)
    except EngineError:
        pass
    return ServedTokenizer(named)


def vocab_decoder(path: str):
    """ids -> text through a transformers directory's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    return lambda ids: tok.decode([int(i) for i in ids])
