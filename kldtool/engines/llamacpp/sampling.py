"""``kldtool generate`` through llama.cpp (contract.py's Sampler): the GGUF's own
``tokenizer.chat_template`` rendered by kldtool's renderer (text/chat.py, as transformers renders
it; llama.cpp's built-in templates are not used), the rendered text tokenized with its special
tokens parsed, and answers drawn by a llama.cpp sampler chain (top-k, top-p, min-p, temperature,
then the seeded draw; greedy at temperature 0) on a context of the sample's own size."""

from __future__ import annotations

import ctypes

import numpy as np

from kldtool.engines.contract import Sampling
from kldtool.errors import EngineError
from kldtool.text.chat import ChatTemplate

TEMPLATE_KEY = b"tokenizer.chat_template"
MAX_TEMPLATE = 1 << 20


def _meta(engine, key: bytes) -> str | None:
    lib = engine.lib
    buf = ctypes.create_string_buffer(MAX_TEMPLATE)
    n = lib.llama_model_meta_val_str(engine.model, key, buf, MAX_TEMPLATE)
    return buf.value.decode("utf-8", "replace") if 0 <= n < MAX_TEMPLATE else None


def _token_text(engine, token: int) -> str | None:
    if token < 0:
        return None
    text = engine.lib.llama_vocab_get_text(engine.vocab, token)
    return text.decode("utf-8", "replace") if text else None


def _chain(lib, s: Sampling, seed: int):
    chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
    if s.temperature == 0:
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        return chain
    if s.top_k:
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_k(s.top_k))
    if s.top_p < 1:
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(s.top_p, 1))
    if s.min_p:
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_min_p(s.min_p, 1))
    lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(s.temperature))
    lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(seed & 0xFFFFFFFF))
    return chain


class Sampler:
    """LlamaCppEngine's Sampler methods (a base class of it)."""

    def chat_template(self) -> ChatTemplate | None:
        source = _meta(self, TEMPLATE_KEY)
        if not source or not source.strip():
            return None
        lib, vocab = self.lib, self.vocab
        named = {"bos_token": lib.llama_vocab_bos(vocab), "eos_token": lib.llama_vocab_eos(vocab)}
        special = {k: t for k, v in named.items() if (t := _token_text(self, int(v)))}
        return ChatTemplate(source, special, f"{self.model_path}'s chat template")

    def tokenize_rendered(self, text: str) -> np.ndarray:
        lib, data = self.lib, text.encode("utf-8")
        cap = len(data) + 8
        buf = (lib.llama_token * cap)()
        got = lib.llama_tokenize(self.vocab, data, len(data), buf, cap, False, True)
        if got < 0:
            raise EngineError(f"llama.cpp tokenization failed ({got})")
        return np.frombuffer(buf, dtype=np.int32, count=got).astype(np.int64)

    samples_per_call = 1

    def sample(self, prompts: list[np.ndarray], s: Sampling, seeds: list[int]) -> list[tuple[np.ndarray, str]]:
        return [self._one(p, s, seed) for p, seed in zip(prompts, seeds)]

    def _one(self, prompt: np.ndarray, s: Sampling, seed: int) -> tuple[np.ndarray, str]:
        lib = self.lib
        cp = lib.llama_context_default_params()
        cp.n_ctx = len(prompt) + s.max_tokens
        cp.n_batch = max(len(prompt), 1)
        cp.n_threads = cp.n_threads_batch = self.threads
        self.attention.apply(cp, lib)
        self.placement.offload.apply(cp)
        ctx = lib.llama_init_from_model(self.model, cp)
        if not ctx:
            raise EngineError(f"{self.model_path}: llama.cpp could not create a context of {cp.n_ctx} tokens")
        chain = _chain(lib, s, seed)
        out: list[int] = []
        try:
            tokens = (lib.llama_token * len(prompt))(*[int(t) for t in prompt])
            batch = lib.llama_batch_get_one(tokens, len(prompt))
            for _ in range(s.max_tokens):
                if lib.llama_decode(ctx, batch) != 0:
                    raise EngineError(f"{self.model_path}: llama_decode failed while sampling")
                token = int(lib.llama_sampler_sample(chain, ctx, -1))
                out.append(token)
                if lib.llama_vocab_is_eog(self.vocab, token):
                    return np.asarray(out, dtype=np.int64), "stop"
                one = (lib.llama_token * 1)(token)
                batch = lib.llama_batch_get_one(one, 1)
            return np.asarray(out, dtype=np.int64), "length"
        finally:
            lib.llama_sampler_free(chain)
            lib.llama_free(ctx)
