"""The forms in which servers return a prompt's log-probs, and reading each answer into one
shape: per prompt position, the log-prob of the prompt's own token and the top K (id, log-prob)
pairs, best first.

- ``vllm``: the completions API with vLLM's ``prompt_logprobs``; token ids in, ids out.
- ``sglang``: SGLang's native ``/generate`` with ``return_logprob``, ``logprob_start_len=0`` and
  ``top_logprobs_num``; token ids in, (log-prob, id, text) triples out (the format of sglang
  0.5.23's tokenizer manager; no SGLang runs on the CPU these tests have).
- ``openai-echo``: the legacy completions form, ``echo`` with ``logprobs`` (vLLM,
  llama-cpp-python's server). Token ids in where the server takes them, else the window's text,
  which the server tokenizes itself: its tokens are then checked against the window's, and the
  first difference refuses the run. Top log-probs come keyed by text (engines/endpoint/pieces.py).

A server's answer is checked as it is read: the shapes, and that every value is a log-prob.
"""

from __future__ import annotations

import math

from kldtool.errors import EngineError

APIS = ("vllm", "sglang", "openai-echo")
LOGPROB_SLACK = 1e-4  # a log-prob above 0 by more than float32 rounding is no log-prob


class Position:
    """One prompt position of an answer: the own token's log-prob and the ranked top K."""

    __slots__ = ("own", "ranked")

    def __init__(self, own: float, ranked: list[tuple[int, float]]):
        self.own, self.ranked = own, ranked


def _logprob(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v > LOGPROB_SLACK:
        raise EngineError(f"{where}: the answer holds values that are not log-probs")
    return float(v)


class VllmForm:
    name = "vllm"
    path = "/v1/completions"
    text = False

    def body(self, model: str, prompt: list[int], k: int) -> dict:
        return {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": k}

    def read(self, answer, prompt: list[int], k: int, where: str, pieces=None) -> list[Position | None]:
        try:
            rows = answer["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise EngineError(
                f"{where}: the answer has no prompt_logprobs (this server does not answer vLLM's form; "
                f"try --endpoint-api openai-echo)"
            ) from None
        if not isinstance(rows, list) or len(rows) != len(prompt):
            got = len(rows) if isinstance(rows, list) else "none"
            raise EngineError(f"{where}: {got} prompt log-probs for a prompt of {len(prompt)} tokens (truncated?)")
        out: list[Position | None] = [None]
        for pos in range(1, len(prompt)):
            row = rows[pos]
            try:
                entries = {int(t): _logprob(v["logprob"], where) for t, v in row.items()}
                ranked = sorted((v["rank"], int(t)) for t, v in row.items() if v["rank"] <= k)
            except (AttributeError, KeyError, TypeError, ValueError):
                raise EngineError(f"{where}, position {pos}: not a log-prob entry") from None
            if prompt[pos] not in entries:
                raise EngineError(f"{where}, position {pos}: the answer lacks the prompt's token {prompt[pos]}")
            out.append(Position(entries[prompt[pos]], [(t, entries[t]) for _, t in ranked[:k]]))
        return out


class SglangForm:
    name = "sglang"
    path = "/generate"
    text = False

    def body(self, model: str, prompt: list[int], k: int) -> dict:
        return {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": k,
        }

    def read(self, answer, prompt: list[int], k: int, where: str, pieces=None) -> list[Position | None]:
        try:
            meta = answer["meta_info"]
            own, tops = meta["input_token_logprobs"], meta["input_top_logprobs"]
        except (KeyError, TypeError):
            raise EngineError(f"{where}: the answer has no input log-probs (not SGLang's /generate)") from None
        if not isinstance(own, list) or not isinstance(tops, list) or not len(own) == len(tops) == len(prompt):
            got = len(own) if isinstance(own, list) else "none"
            raise EngineError(f"{where}: {got} input log-probs for a prompt of {len(prompt)} tokens (truncated?)")
        out: list[Position | None] = [None]
        for pos in range(1, len(prompt)):
            try:
                lp, token = own[pos][0], int(own[pos][1])
                ranked = [(int(e[1]), _logprob(e[0], where)) for e in (tops[pos] or [])[:k]]
            except (IndexError, KeyError, TypeError, ValueError):
                raise EngineError(f"{where}, position {pos}: not a log-prob entry") from None
            if token != prompt[pos]:
                raise EngineError(
                    f"{where}, position {pos}: the server scored token {token} where the prompt has {prompt[pos]}"
                )
            out.append(Position(_logprob(lp, where), ranked))
        return out


class EchoForm:
    """``text``: the server takes text prompts only (decided once, when the form is picked)."""

    name = "openai-echo"
    path = "/v1/completions"

    def __init__(self, text: bool = False):
        self.text = text

    def body(self, model: str, prompt, k: int) -> dict:
        return {
            "model": model,
            "prompt": prompt,
            "echo": True,
            "logprobs": k,
            "max_tokens": 1,
            "temperature": 0.0,
            "return_tokens_as_token_ids": True,  # vLLM: keys as token_id:N, no text to resolve
        }

    def read(self, answer, prompt: list[int], k: int, where: str, pieces=None) -> list[Position | None]:
        try:
            lp = answer["choices"][0]["logprobs"]
            tokens, own, tops = lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise EngineError(f"{where}: the answer has no echoed log-probs (not the legacy echo form)") from None
        if not all(isinstance(x, list) for x in (tokens, own, tops)) or not len(tokens) == len(own) == len(tops):
            raise EngineError(f"{where}: echoed tokens and log-probs of different lengths")
        skip = _leading_bos(tokens, prompt, pieces)
        if len(tokens) < len(prompt) - skip:
            raise EngineError(f"{where}: {len(tokens)} echoed tokens for a prompt of {len(prompt)} (truncated?)")
        out: list[Position | None] = [None] * len(prompt)
        for pos in range(skip, len(prompt)):
            j = pos - skip
            if not isinstance(tokens[j], str) or not pieces.prints_as(prompt[pos], tokens[j]):
                shown = pieces.bytes[prompt[pos]].decode("utf-8", "replace")
                raise EngineError(
                    f"{where}, position {pos}: the server tokenized the text as {tokens[j]!r} where the base "
                    f"file has token {prompt[pos]} ({shown!r}); its tokens are not the base file's"
                )
            if pos == 0 or own[j] is None or tops[j] is None:
                continue  # the first position has none
            if not isinstance(tops[j], dict):
                raise EngineError(f"{where}, position {pos}: not a log-prob entry")
            ranked = sorted(
                ((_logprob(v, where), pieces.id_of(str(key))) for key, v in tops[j].items()), key=lambda e: -e[0]
            )
            out[pos] = Position(_logprob(own[j], where), [(i, v) for v, i in ranked[:k]])
        return out


def _leading_bos(tokens: list, prompt: list[int], pieces) -> int:
    """1 where the server echoes the prompt without its first token, a special one (a BOS it
    adds itself and leaves out of the echo, as llama-cpp-python does), else 0."""
    if len(prompt) < 2 or not tokens or not isinstance(tokens[0], str) or prompt[0] not in pieces.special:
        return 0
    return int(not pieces.prints_as(prompt[0], tokens[0]) and pieces.prints_as(prompt[1], tokens[0]))
