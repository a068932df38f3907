"""A corpus of a model's own samples (``kldtool generate``): JSONL whose first line is a header
(``{"kldtool": "generated", ...}``: the engine and model, the tokenizer's identity, the sampling
settings and seed, the prompts' file and sha256, the chat template's sha256), then one line per
sample: the prompt's token ids exactly as the model saw them, the generated ids, which prompt and
sample it is, its seed and why it ended (``stop``: an end-of-turn token, which is kept;
``length``: --max-tokens reached; ``cut``: a served answer whose next token no id is sure of).
A served model's samples (``generate --endpoint``) also keep what the server said of each
generated token (``served``: its log-prob, the top K's ids and log-probs) and the prompt's
token count as the server counted it: ``compare --generated`` reads them.

``base -f`` reads it as documents (prompt + answer, pretokenized) and by default scores only the
generated positions. A corpus is input like any other: each line is checked whole (types, sizes,
ids non-negative; the vocabulary's bound is checked once the engine is known) before any window
is built, and a bad line is a one-line error naming it. The writer goes through a partial file
renamed into place, so no half-written corpus looks complete, and an interrupted run resumes
from it."""

from __future__ import annotations

import io
import json
import os

import numpy as np

from kldtool.errors import CorpusError

KIND = "generated"
VERSION = 1
FINISH = ("stop", "length", "cut")
MAX_LINE = 16 << 20  # bytes of one line: a sample of ~1M ids
MAX_IDS = 1 << 20  # ids of one sample's prompt or answer
MAX_TOP = 256  # top log-probs per generated token a served sample may keep
LOGPROB_SLACK = 1e-4  # as engines/endpoint/forms.py: above 0 by more than rounding is no log-prob


def is_generated(path: str) -> bool:
    """Whether the file at ``path`` starts with a generated corpus's header (a cheap look)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 20)
        head = json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(head, dict) and head.get("kldtool") == KIND


class CorpusWriter:
    """Samples written as they come, each line flushed, to ``PATH.partial`` beside ``path``;
    ``finish`` renames it into place. A run that stops leaves the partial file, and a run of the
    same header with ``resume`` keeps its complete lines (a torn last line is cut) and goes on
    after them; without ``resume`` a partial file is refused, so no run mixes into another's."""

    def __init__(self, path: str, header: dict, resume: bool = False):
        self.path = os.path.abspath(path)
        self.tmp = f"{self.path}.partial"
        self.header = {"kldtool": KIND, "version": VERSION, **header}
        self.kept: list[dict] = []
        try:
            if resume and os.path.exists(self.tmp):
                self.f = self._reopen(path)
            else:
                fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                self.f = os.fdopen(fd, "w", encoding="utf-8")
                self._line(self.header)
        except FileExistsError:
            raise CorpusError(
                f"{path}: {self.tmp} is an unfinished run's (--resume continues it; remove it to start again)"
            ) from None
        except OSError as e:
            raise CorpusError(f"{path}: cannot write the corpus ({e.strerror})") from None

    def _reopen(self, path: str):
        """The partial file's complete sample lines kept (checked as a corpus's), the rest cut."""
        f = os.fdopen(os.open(self.tmp, os.O_RDWR | os.O_NOFOLLOW), "r+b")
        try:
            first = f.readline(MAX_LINE + 1)
            head = _json(first, self.tmp, 1) if first.endswith(b"\n") else None
            if head is None or _comparable(head) != _comparable(self.header):
                raise CorpusError(f"{path}: {self.tmp} is another run's (its header differs); remove it to start again")
            end, number = f.tell(), 2
            for raw in iter(lambda: f.readline(MAX_LINE + 1), b""):
                if not raw.endswith(b"\n"):
                    break  # the line the stop tore
                self.kept.append(_sample(_json(raw, self.tmp, number), f"{self.tmp}: line {number}"))
                end, number = f.tell(), number + 1
            f.truncate(end)
            f.seek(end)
        except BaseException:
            f.close()
            raise
        return io.TextIOWrapper(f, encoding="utf-8")

    def _line(self, rec: dict) -> None:
        self.f.write(json.dumps(rec, separators=(",", ":"), ensure_ascii=False) + "\n")
        self.f.flush()

    def add(self, prompt: int, sample: int, seed: int, prompt_ids, ids, finish: str, served=None) -> None:
        rec = {"prompt": prompt, "sample": sample, "seed": seed, "finish": finish}
        rec |= {"prompt_ids": [int(i) for i in prompt_ids], "ids": [int(i) for i in ids]}
        self._line(rec | ({"served": served} if served is not None else {}))

    def finish(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)

    def stop(self) -> None:
        """The run stopped: what it wrote stays in the partial file, for --resume."""
        self.f.close()


def _comparable(header: dict) -> dict:
    """A header without what a resumed run may change (kldtool's version)."""
    return {k: v for k, v in header.items() if k != "kldtool_version"}


def read_generated(path: str) -> tuple[dict, list[dict]]:
    """(header, samples) of a generated corpus, every line checked; a sample's ``prompt_ids``
    and ``ids`` become int64 arrays."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise CorpusError(f"{path}: cannot read ({e.strerror})") from None
    with f:
        head = _json(f.readline(MAX_LINE + 1), path, 1)
        if head.get("kldtool") != KIND or head.get("version") != VERSION:
            raise CorpusError(f"{path}: line 1: not a kldtool generated corpus of version {VERSION}")
        samples = []
        for number, raw in enumerate(iter(lambda: f.readline(MAX_LINE + 1), b""), 2):
            if raw.strip():
                samples.append(_sample(_json(raw, path, number), f"{path}: line {number}"))
    if not samples:
        raise CorpusError(f"{path}: no samples")
    return head, samples


def _json(raw: bytes, path: str, number: int) -> dict:
    if len(raw) > MAX_LINE:
        raise CorpusError(f"{path}: line {number}: over {MAX_LINE >> 20} MiB")
    try:
        rec = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorpusError(f"{path}: line {number}: not JSON ({type(e).__name__})") from None
    if not isinstance(rec, dict):
        raise CorpusError(f"{path}: line {number}: not a JSON object")
    return rec


def _ids(value, where: str, name: str, empty: bool) -> np.ndarray:
    ok = isinstance(value, list) and len(value) <= MAX_IDS and (empty or value)
    if not ok or not all(type(i) is int and 0 <= i < 1 << 31 for i in value):
        raise CorpusError(f"{where}: {name} must be a list of token ids (0 <= id < 2^31), at most {MAX_IDS}")
    return np.asarray(value, dtype=np.int64)


def _sample(rec: dict, where: str) -> dict:
    if rec.get("finish") not in FINISH:
        raise CorpusError(f"{where}: finish must be one of {', '.join(FINISH)}")
    for key in ("prompt", "sample", "seed"):
        if type(rec.get(key)) is not int or rec[key] < 0:
            raise CorpusError(f"{where}: {key} must be a non-negative integer")
    out = {
        "prompt": rec["prompt"],
        "sample": rec["sample"],
        "seed": rec["seed"],
        "finish": rec["finish"],
        "prompt_ids": _ids(rec.get("prompt_ids"), where, "prompt_ids", empty=False),
        "ids": _ids(rec.get("ids"), where, "ids", empty=rec["finish"] == "cut"),
    }
    if "served" in rec:
        out["served"] = _served(rec["served"], len(out["ids"]), where)
    return out


def _served(rec, n: int, where: str) -> dict:
    """A served sample's log-probs, checked whole: one entry per generated token, each a finite
    log-prob (the top K's may be null where the server named fewer), ids -1 (none sure) or more."""
    bad = f"{where}: served must hold logprobs, top_ids and top_logprobs for each of its {n} tokens"
    if not isinstance(rec, dict):
        raise CorpusError(bad)
    own, ids, tops = rec.get("logprobs"), rec.get("top_ids"), rec.get("top_logprobs")
    if not all(isinstance(x, list) and len(x) == n for x in (own, ids, tops)):
        raise CorpusError(bad)
    k = len(ids[0]) if n else 1
    if not 1 <= k <= MAX_TOP or not all(isinstance(r, list) and len(r) == k for r in (*ids, *tops)):
        raise CorpusError(f"{where}: served top_ids and top_logprobs must be lists of one length, 1 to {MAX_TOP}")
    if not all(type(i) is int and -1 <= i < 1 << 31 for r in ids for i in r):
        raise CorpusError(f"{where}: served top_ids must be token ids or -1")
    lp = np.array([_finite(v, where) for v in own], np.float64)
    top = np.array([[np.nan if v is None else _finite(v, where) for v in r] for r in tops], np.float64)
    counted = rec.get("prompt_tokens")
    if counted is not None and (type(counted) is not int or counted < 0):
        raise CorpusError(f"{where}: served prompt_tokens must be a count or null")
    return {"logprobs": lp, "top_ids": np.array(ids, np.int64).reshape(n, k), "top_logprobs": top.reshape(n, k),
            "prompt_tokens": counted}  # fmt: skip


def _finite(v, where: str) -> float:
    if type(v) not in (int, float) or not np.isfinite(v) or v > LOGPROB_SLACK:
        raise CorpusError(f"{where}: served log-probs must be finite numbers at most 0")
    return float(v)
