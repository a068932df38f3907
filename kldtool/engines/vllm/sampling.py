"""``kldtool generate`` through vLLM (contract.py's Sampler), offline and served: the chat side is
hf_chat.py's (vLLM's tokenizer is the checkpoint's Hugging Face one); the answers are vLLM's own
sampler's, every setting given explicitly (vLLM would otherwise take the checkpoint's
generation_config.json defaults), each request seeded with its sample's seed. vLLM ends a turn
at the tokenizer's and the generation config's end-of-sequence ids, the token kept.

The served engine's answers come from another process: each is checked whole (one choice, ids in
the vocabulary, no more than asked for, a finish reason that is one of the two) before use."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kldtool.engines.contract import Sampling
from kldtool.engines.hf_chat import HfChat
from kldtool.errors import EngineError

FINISHES = ("stop", "length")
# Requests per call: enough for vLLM to batch, few enough that progress moves.
SAMPLES_PER_CALL = 32


def settings(s: Sampling, seed: int) -> dict:
    """vLLM's SamplingParams (and completions fields) for one sample."""
    greedy = s.temperature == 0
    return {
        "max_tokens": s.max_tokens,
        "temperature": 0.0 if greedy else s.temperature,
        "top_p": 1.0 if greedy else s.top_p,
        "top_k": 0 if greedy else s.top_k,
        "min_p": 0.0 if greedy else s.min_p,
        "repetition_penalty": 1.0,
        "seed": seed,
    }


def checked(ids, finish, s: Sampling, n_vocab: int, where: str) -> tuple[np.ndarray, str]:
    """One answer, refused unless it is ids of the vocabulary, at most max_tokens of them, ending
    for one of the two reasons (a "length" answer has all of them)."""
    if not isinstance(ids, list) or not all(type(t) is int and 0 <= t < n_vocab for t in ids):
        raise EngineError(f"{where}: the answer's token ids are not ids of the model's {n_vocab}-token vocabulary")
    if finish not in FINISHES or len(ids) > s.max_tokens or (finish == "length" and len(ids) != s.max_tokens):
        raise EngineError(f"{where}: {len(ids)} ids ending by {finish!r} for --max-tokens {s.max_tokens}")
    return np.asarray(ids, dtype=np.int64), finish


class OfflineSampler(HfChat):
    """VllmEngine's Sampler methods (a base class of it): one vLLM call per batch of samples."""

    samples_per_call = SAMPLES_PER_CALL

    def sample(self, prompts: list[np.ndarray], s: Sampling, seeds: list[int]) -> list[tuple[np.ndarray, str]]:
        from kldtool.engines.vllm import seam

        got = seam.sample(self.llm, [[int(t) for t in p] for p in prompts], [settings(s, seed) for seed in seeds])
        return [checked(ids, finish, s, self.n_vocab, f"vLLM sample {k}") for k, (ids, finish) in enumerate(got)]


class ServedSampler(HfChat):
    """VllmServerEngine's Sampler methods (a base class of it): one completion per sample, sent
    together so the server batches them; the ids come back with ``return_token_ids``."""

    samples_per_call = SAMPLES_PER_CALL

    def sample(self, prompts: list[np.ndarray], s: Sampling, seeds: list[int]) -> list[tuple[np.ndarray, str]]:
        def one(k: int) -> tuple[np.ndarray, str]:
            body = {"model": self.model_id, "prompt": [int(t) for t in prompts[k]], "return_token_ids": True}
            answer = self._request("/v1/completions", body | settings(s, seeds[k]))
            choices = answer.get("choices") if isinstance(answer, dict) else None
            where = f"{self.url}: sample {k}"
            if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
                raise EngineError(f"{where}: the answer does not hold exactly one choice")
            return checked(choices[0].get("token_ids"), choices[0].get("finish_reason"), s, self.n_vocab, where)

        with ThreadPoolExecutor(max_workers=max(len(prompts), 1)) as pool:
            return list(pool.map(one, range(len(prompts))))
