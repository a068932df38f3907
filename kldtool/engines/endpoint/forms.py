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

A server's answer is checked as a whole before anything is computed from it or written: its
shapes; every value a finite log-prob (no NaN, no infinity, no integer too large for a float);
per position, ids unique once normalised ("0" and "00" are one id, and twice is a refusal, not a
merge), the top K in order and summing to at most 1 + MASS_SLACK, and the prompt's own token's
log-prob equal to its entry in the top K where it has one, and no greater than the K-th where it
has none. Each refusal is one line naming the server, the window and the position.
"""

from __future__ import annotations

import math
import re

from kldtool.errors import EngineError

APIS = ("vllm", "sglang", "openai-echo")
SAMPLING_APIS = ("chat", "completions")  # generate --endpoint's (engines/endpoint/sampled.py)
LOGPROB_SLACK = 1e-4  # a log-prob above 0 by more than float32 rounding is no log-prob
MASS_SLACK = 1e-3  # servers round their log-probs: a top K may sum to a little over 1
AGREE_SLACK = 1e-3  # the same token's log-prob given twice (own and in the top K), or out of order
_ID = re.compile(r"[0-9]{1,12}\Z")


class Position:
    """One prompt position of an answer: the own token's log-prob and the ranked top K."""

    __slots__ = ("own", "ranked")

    def __init__(self, own: float, ranked: list[tuple[int, float]]):
        self.own, self.ranked = own, ranked


def _logprob(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise EngineError(f"{where}: the answer holds values that are not log-probs")
    try:
        f = float(v)
    except OverflowError:
        raise EngineError(f"{where}: the answer holds a number too large for a log-prob") from None
    if not math.isfinite(f) or f > LOGPROB_SLACK:
        raise EngineError(f"{where}: the answer holds values that are not log-probs ({'NaN' if f != f else f})")
    return f


def _token_id(t, where: str) -> int:
    """A token id as a server names it: an int, or a string of digits (vLLM's dict keys)."""
    if isinstance(t, str) and _ID.match(t):
        return int(t)
    if isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 40:
        return t
    raise EngineError(f"{where}: not a token id ({t!r:.40})")


def position(own: float, ranked: list[tuple[int, float]], k: int, where: str) -> Position:
    """One position's answer checked as a whole (the module's docstring says what); ``ranked``
    in the server's order, -1 for an entry no id is sure of (a text several tokens print as)."""
    known = [t for t, _ in ranked if t >= 0]
    if len(set(known)) != len(known):
        twice = next(t for t in known if known.count(t) > 1)
        raise EngineError(f"{where}: the answer names token {twice} more than once")
    values = [v for _, v in ranked]
    if any(b > a + AGREE_SLACK for a, b in zip(values, values[1:])):
        raise EngineError(f"{where}: the top log-probs are not in order, best first")
    mass = math.fsum(math.exp(v) for v in values)
    if mass > 1 + MASS_SLACK:
        raise EngineError(f"{where}: the top {len(values)} log-probs sum to a probability of {mass:.4f}, above 1")
    return Position(own, ranked)


def agrees(pos: Position, target: int, k: int, where: str) -> None:
    """The prompt's token's own log-prob against the top K: equal to its entry there, else (a
    full top K, every id sure) no greater than the K-th."""
    mine = [v for t, v in pos.ranked if t == target]
    if mine and abs(mine[0] - pos.own) > AGREE_SLACK:
        raise EngineError(
            f"{where}: token {target}'s log-prob is {pos.own:.6g} and, in the top K, {mine[0]:.6g}: not one answer"
        )
    full = len(pos.ranked) >= k > 0 and all(t >= 0 for t, _ in pos.ranked)
    if not mine and full and pos.own > pos.ranked[k - 1][1] + AGREE_SLACK:
        raise EngineError(f"{where}: token {target} is outside the top {k} with a log-prob above the {k}th's")


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
            row, at = rows[pos], f"{where}, position {pos}"
            if not isinstance(row, dict):
                raise EngineError(f"{at}: not a log-prob entry")
            try:
                listed = [(_token_id(t, at), v["logprob"], v["rank"]) for t, v in row.items()]
                entries = {t: _logprob(lp, at) for t, lp, _ in listed}
                if len(entries) < len(listed):
                    twice = next(t for t, _, _ in listed if sum(1 for x in listed if x[0] == t) > 1)
                    raise EngineError(f"{at}: the answer names token {twice} more than once")
                ranks = [r for _, _, r in listed]
                if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
                    raise TypeError
                ranked = sorted((r, t) for t, _, r in listed if r <= k)
            except (AttributeError, KeyError, TypeError, ValueError):
                raise EngineError(f"{at}: not a log-prob entry") from None
            if prompt[pos] not in entries:
                raise EngineError(f"{at}: the answer lacks the prompt's token {prompt[pos]}")
            checked = position(entries[prompt[pos]], [(t, entries[t]) for _, t in ranked[:k]], k, at)
            agrees(checked, prompt[pos], k, at)
            out.append(checked)
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
            at = f"{where}, position {pos}"
            try:
                lp, token = own[pos][0], _token_id(own[pos][1], at)
                ranked = [(_token_id(e[1], at), _logprob(e[0], at)) for e in (tops[pos] or [])[:k]]
            except (IndexError, KeyError, TypeError, ValueError):
                raise EngineError(f"{at}: not a log-prob entry") from None
            if token != prompt[pos]:
                raise EngineError(f"{at}: the server scored token {token} where the prompt has {prompt[pos]}")
            checked = position(_logprob(lp, at), ranked, k, at)
            agrees(checked, token, k, at)
            out.append(checked)
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
            at = f"{where}, position {pos}"
            if not isinstance(tops[j], dict):
                raise EngineError(f"{at}: not a log-prob entry")
            ranked = sorted(
                ((_logprob(v, at), pieces.id_of(str(key))) for key, v in tops[j].items()), key=lambda e: -e[0]
            )
            checked = position(_logprob(own[j], at), [(i, v) for v, i in ranked[:k]], k, at)
            agrees(checked, prompt[pos], k, at)
            out[pos] = checked
        return out


def _leading_bos(tokens: list, prompt: list[int], pieces) -> int:
    """1 where the server echoes the prompt without its first token, a special one (a BOS it
    adds itself and leaves out of the echo, as llama-cpp-python does), else 0."""
    if len(prompt) < 2 or not tokens or not isinstance(tokens[0], str) or prompt[0] not in pieces.special:
        return 0
    return int(not pieces.prints_as(prompt[0], tokens[0]) and pieces.prints_as(prompt[1], tokens[0]))
