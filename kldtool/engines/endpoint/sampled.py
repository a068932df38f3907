"""Answers a server samples, with the log-probs it reports for them: the request bodies (every
sampling setting sent, none left to the server's defaults) and each answer read into one shape,
checked as a whole.

Two APIs: ``completions`` (the prompt as token ids where the server takes them, else as text)
and ``chat`` (the server renders the messages with its own template). Per generated token the
answer names the token it sampled, that token's log-prob and the top K (ids where the server
gives them: vLLM's ``return_tokens_as_token_ids``; text otherwise, mapped to the only id that
prints that way, engines/endpoint/pieces.py).

Checked before anything is kept: one choice; a finish reason of the two; no more tokens than
asked, all of them where the answer ran to the limit, and as many as the server's own count;
every log-prob finite and at most 0; per position, the top K as forms.py checks a prompt's (ids
unique, best first, summing to at most 1) and the sampled token's log-prob agreeing with its
entry there. A sampled token no id is sure of ends the answer before it (``cut``): the corpus
keeps what is known.
"""

from __future__ import annotations

import math

import numpy as np

from kldtool.engines.contract import Sampling
from kldtool.engines.endpoint.forms import _logprob, agrees, position
from kldtool.errors import EngineError

MAX_TOP_LOGPROBS = 20  # OpenAI's chat API allows at most 20; most providers follow it


def settings(s: Sampling, seed: int, k: int) -> dict:
    """Every setting that moves a sampler, as the servers this runs against name them: OpenAI's
    fields, vLLM's and llama-cpp-python's extras (llama-cpp-python alone defaults to temperature
    0.8, top-p 0.95, top-k 40, min-p 0.05 and a repeat penalty of 1.1)."""
    return {
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,  # 0: off for vLLM and llama.cpp alike
        "min_p": s.min_p,
        "typical_p": 1.0,
        "repetition_penalty": 1.0,
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "mirostat_mode": 0,
        "n": 1,
        "seed": seed,
        "stream": False,
        "return_tokens_as_token_ids": True,  # vLLM: every token named by its id
        "logprobs": k,
    }


def completion_body(model: str, prompt, s: Sampling, seed: int, k: int) -> dict:
    return {"model": model, "prompt": prompt, **settings(s, seed, k)}


def chat_body(model: str, messages: list, s: Sampling, seed: int, k: int) -> dict:
    body = {"model": model, "messages": messages, **settings(s, seed, k)}
    body["logprobs"], body["top_logprobs"] = True, k
    return body


class Answer:
    """One sampled answer: ``ids`` (int64), ``finish`` (stop, length or cut), the served
    log-prob of each token, the top K's ids (-1: none sure) and log-probs per position (NaN
    where fewer came), and the prompt's token count as the server counted it (None: not said)."""

    __slots__ = ("ids", "finish", "logprobs", "top_ids", "top_logprobs", "prompt_tokens")

    def __init__(self, ids, finish, logprobs, top_ids, top_logprobs, prompt_tokens):
        self.ids, self.finish, self.logprobs = ids, finish, logprobs
        self.top_ids, self.top_logprobs, self.prompt_tokens = top_ids, top_logprobs, prompt_tokens

    def served(self) -> dict:
        """What the corpus keeps of the server's word (text/generated.py's ``served``)."""
        return {
            "logprobs": [float(v) for v in self.logprobs],
            "top_ids": self.top_ids.tolist(),
            "top_logprobs": [[None if math.isnan(v) else float(v) for v in row] for row in self.top_logprobs],
            "prompt_tokens": self.prompt_tokens,
        }


def _entries(answer, chat: bool, where: str) -> tuple[list, str, object]:
    """(per position (key, log-prob, [(key, log-prob)...]), finish reason, usage) of either API."""
    try:
        choices = answer["choices"]
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            raise EngineError(f"{where}: the answer does not hold exactly one choice")
        choice = choices[0]
        lp = choice["logprobs"]
        if chat:
            content = lp["content"]
            rows = [
                (e["token"], e["logprob"], [(t["token"], t["logprob"]) for t in e["top_logprobs"]]) for e in content
            ]
        else:
            tokens, own, tops = lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]
            if not all(isinstance(x, list) for x in (tokens, own, tops)) or not len(tokens) == len(own) == len(tops):
                raise EngineError(f"{where}: the answer's tokens and log-probs are of different lengths")
            rows = [(t, v, list(top.items())) for t, v, top in zip(tokens, own, tops)]
    except EngineError:
        raise
    except (KeyError, IndexError, TypeError, AttributeError):
        raise EngineError(f"{where}: the answer holds no log-probs of its tokens (logprobs not returned?)") from None
    return rows, choice.get("finish_reason"), answer.get("usage")


def read_answer(answer, chat: bool, s: Sampling, k: int, pieces, n_vocab: int, where: str) -> Answer:
    rows, finish, usage = _entries(answer, chat, where)
    if finish not in ("stop", "length"):
        raise EngineError(f"{where}: the answer ended by {str(finish)[:40]!r}, not stop or length")
    if len(rows) > s.max_tokens or (finish == "length" and len(rows) != s.max_tokens):
        raise EngineError(f"{where}: {len(rows)} tokens ending by {finish!r} for --max-tokens {s.max_tokens}")
    counted = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if counted is not None and counted != len(rows):
        raise EngineError(f"{where}: {len(rows)} tokens with log-probs, and the server counts {counted!r}")
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if prompt_tokens is not None and (type(prompt_tokens) is not int or prompt_tokens < 0):
        raise EngineError(f"{where}: usage.prompt_tokens is not a count")
    ids, own = [], []
    top_ids = np.full((len(rows), k), -1, np.int64)
    top_lps = np.full((len(rows), k), np.nan)
    for j, (key, value, top) in enumerate(rows):
        at = f"{where}, token {j}"
        if not isinstance(key, str) or not isinstance(top, list) or len(top) > 4 * k + 1:
            raise EngineError(f"{at}: not a log-prob entry")
        lp = _logprob(value, at)
        ranked = sorted(((_logprob(v, at), _id(t, pieces, n_vocab, at)) for t, v in top), key=lambda e: -e[0])
        token = _id(key, pieces, n_vocab, at)
        checked = position(lp, [(i, v) for v, i in ranked[:k]], k, at)
        if token < 0:  # a token no id is sure of: the answer ends before it
            return _answer(ids, "cut", own, top_ids[:j], top_lps[:j], prompt_tokens)
        agrees(checked, token, k, at)
        for i, (t, v) in enumerate(checked.ranked):
            top_ids[j, i], top_lps[j, i] = t, v
        ids.append(token)
        own.append(lp)
    return _answer(ids, finish, own, top_ids, top_lps, prompt_tokens)


def _answer(ids, finish, own, top_ids, top_lps, prompt_tokens) -> Answer:
    return Answer(np.asarray(ids, np.int64), finish, np.asarray(own, np.float64), top_ids, top_lps, prompt_tokens)


def _id(key, pieces, n_vocab: int, where: str) -> int:
    if not isinstance(key, str):
        raise EngineError(f"{where}: a token named by something that is not text ({key!r:.40})")
    t = pieces.id_of(key)
    if t >= n_vocab:
        raise EngineError(f"{where}: the answer names token ids outside the vocabulary")
    return t
