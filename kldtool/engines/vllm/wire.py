"""The request spec kldtool's clients send to its hook in vLLM's workers: one versioned format,
built here by the clients and checked here by the workers before they allocate or open anything.

A spec travels in ``SamplingParams.extra_args[SPEC_KEY]``: a dict from the offline engine, a
JSON string in a served completion's ``vllm_xargs`` (which holds only flat values). A served
request comes from whoever can reach the server's API, so :func:`parse` trusts nothing in it:
every field has a type and a range, sizes must equal what the loaded model says, positions
must fit the prompt vLLM actually received, and anything unknown is refused. Its errors are
one line and never quote a file's bytes.

Four fields form the envelope, the same in every version, so a worker can tell where a
refusal may be written before it knows whether it understands the rest: ``v`` (the version),
``key`` (the result's file name stem), ``out`` (the exchange directory, served requests only)
and ``token`` (the operator's shared secret, where the server asks for one).

This module is all a client imports of the vLLM package: it needs neither vLLM nor the worker.
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from dataclasses import dataclass

from kldtool.codec.rows import CODECS, DEFAULT_CLAMP, MAX_CLAMP
from kldtool.codec.topk_records import MIN_KEEP
from kldtool.logitsfile.header import rows_width
from kldtool.logitsfile.hidden import DTYPES

VERSION = 2  # 1: the unversioned spec of kldtool before the served hook took operator settings
# Settings a server's operator and its clients both read from their environment (policy.py has
# the server's whole table): results go below the exchange root; requests carry the token.
EXCHANGE_ROOT = "KLDTOOL_VLLM_EXCHANGE_ROOT"
TOKEN = "KLDTOOL_VLLM_TOKEN"
SPEC_KEY = "kldtool"  # its name in extra_args / vllm_xargs
MODES = ("probe", "compare", "encode", "nll", "hidden")
KINDS = ("npz", "err", "json")  # what a served request's result file may be
MAX_SPEC_CHARS = 8192  # a real spec is a few hundred characters
MAX_PATH_CHARS = 4096
MAX_PROBE_ROWS = 256  # rows of a hidden-state request whose float32 logits leave the worker for the replay probe
LOGITS_BUDGET = 256 << 20  # bytes of logits the hook holds at once, by default
MAX_LOGITS_BUDGET = 1 << 30  # the most logits the hook holds at once, whatever a request asks

_RUN = re.compile(r"[0-9a-f]{12}\Z")
_KEY = re.compile(r"[0-9a-f]{12}-(?:probe|[0-9]{1,10})\Z")


class SpecError(ValueError):
    """A spec the worker refuses: one line saying which field and why."""


def new_run() -> str:
    """A run's id: keys of different calls never meet, and nobody guesses another run's keys."""
    return uuid.uuid4().hex[:12]


def window_key(run: str, index: int) -> str:
    assert _RUN.match(run) and index >= 0
    return f"{run}-{index}"


def probe_key(run: str) -> str:
    assert _RUN.match(run)
    return f"{run}-probe"


def exchange_name(key: str, kind: str) -> str:
    """A served request's result's file name: ``KEY.npz`` (arrays), ``KEY.err`` (one line of
    text) or ``KEY.json`` (a probe's answer)."""
    if not _KEY.match(key) or kind not in KINDS:
        raise SpecError(f"not an exchange file: {key!r}.{kind!r}")
    return f"{key}.{kind}"


def exchange_path(directory: str, key: str, kind: str) -> str:
    """Where the client looks for a result (the hook writes through a descriptor instead)."""
    return os.path.join(directory, exchange_name(key, kind))


def logits_block_rows(n_vocab: int, itemsize: int, budget: int = LOGITS_BUDGET) -> int:
    """Rows per logits block: each row is the all-gathered logits in the model's dtype plus
    their float32 copy for the reducer (at least 16 rows)."""
    return max(16, budget // (n_vocab * (itemsize + 4)))


def window_spec(key: str, w, logits_block: int, mode: dict) -> dict:
    """What the hook needs to score window ``w`` (a protocols.Window) in ``mode``."""
    return {
        "v": VERSION,
        "key": key,
        "first": int(w.first),
        "n_scored": int(w.n_scored),
        "chunk": int(w.index),
        "after": int(w.targets[-1]),
        "logits_block": int(logits_block),
        **mode,
    }


def probe_spec(key: str) -> dict:
    return {"v": VERSION, "key": key, "mode": "probe"}


def served(spec: dict, out: str, token: str | None) -> str:
    """The spec as a served request carries it: a JSON string with the exchange directory and
    the operator's token, if any."""
    return json.dumps({**spec, "out": out, **({"token": token} if token else {})})


@dataclass(frozen=True)
class ModelFacts:
    """What the worker knows of its loaded model; a spec's sizes must equal these."""

    n_vocab: int
    hidden_size: int
    dtype: str  # float32, bfloat16, float16

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 2

    def max_logits_block(self) -> int:
        return logits_block_rows(self.n_vocab, self.itemsize, MAX_LOGITS_BUDGET)


@dataclass(frozen=True)
class Envelope:
    """The version-independent part of a spec: enough to decide where a refusal may go."""

    key: str | None  # None: not a key this worker may name a file after
    out: str | None
    token: object
    version: object


@dataclass(kw_only=True, frozen=True)
class Spec:
    mode: str
    key: str
    out: str | None = None
    first: int = 0
    n_scored: int = 0
    chunk: int = 0
    after: int = 0
    logits_block: int = 0
    base: str | None = None  # compare
    coding: dict | None = None  # encode: kldtool.codec.Coding's fields
    row_width: int = 0  # encode
    dim: int = 0  # hidden
    hidden_item: str = ""  # hidden
    probe_rows: int = 0  # hidden


def decode(raw) -> dict:
    """A spec as it arrived (dict, or JSON text) -> dict, refusing anything that is not a small
    JSON object of plain values."""
    if isinstance(raw, str):
        if len(raw) > MAX_SPEC_CHARS:
            raise SpecError(f"spec of {len(raw)} characters (at most {MAX_SPEC_CHARS})")
        try:
            raw = json.loads(raw, parse_constant=_no_constant)
        except (ValueError, RecursionError) as e:
            raise SpecError(f"spec is not JSON ({_short(e)})") from None
    if not isinstance(raw, dict):
        raise SpecError(f"spec is a {type(raw).__name__}, not an object")
    return raw


def is_text(value, limit: int = MAX_PATH_CHARS) -> bool:
    """Whether a client's text field may be used at all: a string of 1..``limit`` characters,
    without NUL, that is UTF-8 as it stands. JSON's ``\\ud800`` escape makes a lone surrogate,
    which no path or token holds and which fails every later encode (a path's, a comparison's)."""
    if not isinstance(value, str) or not 0 < len(value) <= limit or "\0" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def envelope(spec: dict) -> Envelope:
    key = spec.get("key")
    out = spec.get("out")
    return Envelope(
        key if isinstance(key, str) and _KEY.match(key) else None,
        out if is_text(out) else None,
        spec.get("token"),
        spec.get("v"),
    )


_COMMON = {"v", "key", "mode", "out", "token"}
_WINDOW = {"first", "n_scored", "chunk", "after", "logits_block"}
_FIELDS = {
    "probe": set(),
    "nll": _WINDOW,
    "compare": _WINDOW | {"base"},
    "encode": _WINDOW | {"coding", "row_width"},
    "hidden": _WINDOW | {"dim", "hidden_item", "n_vocab", "probe_rows"},
}


def parse(spec: dict, prompt_len: int, model: ModelFacts, served_request: bool) -> Spec:
    """The checked spec of a request whose prompt vLLM holds as ``prompt_len`` tokens, for
    ``model``; SpecError (one line) for anything a client of this version would not send."""
    if spec.get("v") != VERSION:
        raise SpecError(
            f"wire protocol version {_shown(spec.get('v'))} from the client, {VERSION} in the server's "
            f"kldtool: install the same kldtool on both"
        )
    mode = spec.get("mode")
    if not isinstance(mode, str) or mode not in MODES:
        raise SpecError(f"mode {_shown(mode)}: expected one of {', '.join(MODES)}")
    unknown = sorted(set(spec) - _COMMON - _FIELDS[mode], key=str)
    if unknown:
        raise SpecError(f"unknown field {_shown(unknown[0])} for mode {mode}")
    env = envelope(spec)
    if env.key is None:
        raise SpecError(f"key {_shown(spec.get('key'))}: expected 12 hex digits, '-', and a window number or 'probe'")
    if served_request and env.out is None:
        raise SpecError("out: a served request names its exchange directory")
    if not served_request and "out" in spec:
        raise SpecError("out: only served requests write results to files")
    if mode == "probe":
        return Spec(mode=mode, key=env.key, out=env.out)
    first = _int(spec, "first", 0, prompt_len - 1)
    n_scored = _int(spec, "n_scored", 1, prompt_len - first)
    fields = dict(
        first=first,
        n_scored=n_scored,
        chunk=_int(spec, "chunk", 0, 2**31 - 1),
        # the target after the prompt's last position, which a rolling window scores
        after=_int(spec, "after", 0, model.n_vocab - 1),
        # a larger block than the hook allows is cut to it: the records do not depend on it
        logits_block=min(_int(spec, "logits_block", 1, 2**31 - 1), model.max_logits_block()),
    )
    if mode == "compare":
        base = spec.get("base")
        if not is_text(base):
            raise SpecError(
                f"base {_shown(base)}: expected a path (UTF-8 text, no NUL, {MAX_PATH_CHARS} characters at most)"
            )
        if not os.path.isabs(base):
            raise SpecError(f"base {_shown(base)}: expected an absolute path")
        fields["base"] = base
    elif mode == "encode":
        coding = _coding(spec.get("coding"), model.n_vocab)
        width = rows_width(model.n_vocab, coding["keep"])
        fields.update(coding=coding, row_width=_equal(spec, "row_width", width, "the model's row width"))
    elif mode == "hidden":
        if model.dtype not in DTYPES:
            raise SpecError(f"mode hidden: the server's {model.dtype} model has no stored hidden-state type")
        _equal(spec, "n_vocab", model.n_vocab, "the model's vocabulary")
        fields.update(
            dim=_equal(spec, "dim", model.hidden_size, "the model's hidden size"),
            hidden_item=_equal(spec, "hidden_item", DTYPES[model.dtype][0], f"a {model.dtype} model's"),
            probe_rows=_int(spec, "probe_rows", 0, min(n_scored, MAX_PROBE_ROWS)),
        )
    return Spec(mode=mode, key=env.key, out=env.out, **fields)


def _coding(raw, n_vocab: int) -> dict:
    if not isinstance(raw, dict) or set(raw) != {"codec", "clamp", "keep"}:
        raise SpecError("coding: expected an object of codec, clamp and keep")
    codec, clamp, keep = raw["codec"], raw["clamp"], raw["keep"]
    if not isinstance(codec, str) or codec not in CODECS:
        raise SpecError(f"coding.codec {_shown(codec)}: expected one of {', '.join(CODECS)}")
    if type(clamp) not in (int, float) or not math.isfinite(clamp) or not DEFAULT_CLAMP <= clamp <= MAX_CLAMP:
        raise SpecError(f"coding.clamp {_shown(clamp)}: expected {DEFAULT_CLAMP:g}..{MAX_CLAMP:g} nats")
    if keep is not None and (type(keep) is not int or not MIN_KEEP <= keep <= n_vocab):
        raise SpecError(f"coding.keep {_shown(keep)}: expected null or {MIN_KEEP}..{n_vocab}")
    return {"codec": codec, "clamp": float(clamp), "keep": keep}


def _int(spec: dict, name: str, lo: int, hi: int) -> int:
    value = spec.get(name)
    if type(value) is not int or not lo <= value <= hi:  # bool is an int to Python, not to us
        raise SpecError(f"{name} {_shown(value)}: expected an integer in {lo}..{hi}")
    return value


def _equal(spec: dict, name: str, want, what: str):
    value = spec.get(name)
    if type(value) is not type(want) or value != want:
        raise SpecError(f"{name} {_shown(value)}: {what} is {want}")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def one_line(text: str, limit: int = 500) -> str:
    """``text`` as one printable line of at most ``limit`` characters (an error file, a log line)."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shown(value, limit: int = 40) -> str:
    """A client's value as an error quotes it: short, printable, one line."""
    return one_line(repr(value), limit)


def _short(e: Exception) -> str:
    return _shown(str(e), 80).strip("'\"")
