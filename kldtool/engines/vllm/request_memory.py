"""The host memory one served request costs the hook, computed from its checked spec before any
of it is allocated, and the operator's bound on it (``KLDTOOL_VLLM_MAX_REQUEST_BYTES``).

A request holds its result arrays until its last position is scored (an encode request: a
uint16 row of the whole vocabulary per position), and works through its logits one block at a
time (the block's logits in the model's dtype, their float32 copy, and for compare the base
rows read and decoded beside them). Both are known from the spec and the model alone, so a
request whose sum exceeds the bound is refused at admission, on every tensor-parallel rank
alike, before a byte of it is allocated or a logits call is asked of any rank.
"""

from __future__ import annotations

import re

import numpy as np

from kldtool.engines.vllm import wire

MAX_REQUEST_BYTES = "KLDTOOL_VLLM_MAX_REQUEST_BYTES"
# Unset, the bound admits an encode of this many scored positions at the default logits block:
# llama-perplexity's default -c 4096 scores 2,048 positions a window. Sized by the model, so a
# 49k-vocabulary server admits what a 128k one does, row for row.
DEFAULT_ROWS = 2048
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"\s*([0-9]+)\s*([KMGT]?)(?:i?B)?\s*\Z", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``2G``, ``512M``, ``1073741824`` -> bytes (binary units); ValueError for anything else."""
    m = _SIZE.match(text)
    if not m or int(m.group(1)) == 0:
        raise ValueError(f"{MAX_REQUEST_BYTES}={wire.one_line(text, 40)}: expected a size in bytes such as 2G or 512M")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def request_bytes(spec: wire.Spec, model: wire.ModelFacts) -> int:
    """What the hook holds for ``spec`` at its largest: its result arrays plus one logits block."""
    if spec.mode == "probe":
        return 0
    n, v = spec.n_scored, model.n_vocab
    if spec.mode == "compare":
        from kldtool.reduce.records import FIELDS

        held = n * sum(np.dtype(dt).itemsize for dt in FIELDS.values())
    else:
        held = n * 4  # the target's NLL
        if spec.mode == "encode":
            held += n * spec.row_width * 2
        elif spec.mode == "hidden":
            held += n * spec.dim * np.dtype(spec.hidden_item).itemsize + spec.probe_rows * v * 4
    per_row = v * (model.itemsize + 4)  # the block's logits and their float32 copy
    if spec.mode == "compare":
        per_row += v * (2 + 4)  # a full base row read (uint16) and decoded (float32): top-K rows are smaller
    elif spec.mode == "encode":
        per_row += spec.row_width * 2 + v * 4  # the encoded row and the log-softmax's float32 row
    return held + min(spec.logits_block, n) * per_row


def default_bound(model: wire.ModelFacts) -> int:
    """The bound where the operator sets none: an encode of DEFAULT_ROWS positions."""
    from kldtool.logitsfile.header import rows_width

    width = rows_width(model.n_vocab, None)
    block = wire.logits_block_rows(model.n_vocab, model.itemsize)
    return request_bytes(
        wire.Spec(mode="encode", key="", n_scored=DEFAULT_ROWS, logits_block=block, row_width=width), model
    )


def check(spec: wire.Spec, model: wire.ModelFacts, bound: int | None) -> None:
    """SpecError (one line) where ``spec`` would hold more than ``bound`` bytes (None: the default)."""
    limit = bound or default_bound(model)
    need = request_bytes(spec, model)
    if need > limit:
        raise wire.SpecError(
            f"{spec.mode} request of {spec.n_scored} scored positions needs {_mib(need)} in the hook "
            f"({model.n_vocab:,}-entry vocabulary), above the server's {MAX_REQUEST_BYTES} of {_mib(limit)}"
            f"{'' if bound else ' (its default for this model)'}: score shorter windows, or ask the operator to raise it"
        )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"
