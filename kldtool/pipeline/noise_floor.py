"""``kldtool noise-floor``: the base model compared against itself run another, equally valid
way (another dtype, batch size, device or engine). Its mean KLD is the smallest difference a
quant can be told apart from, so ``compare --noise-floor`` reports a quant as a multiple of it.
"""

from __future__ import annotations

from kldtool.errors import UsageError
from kldtool.identity import base_identity
from kldtool.pipeline.common import Sinks
from kldtool.pipeline.compare import run_compare
from kldtool.report.ordering import FLOOR_KIND as KIND  # the command name a floor file records
from kldtool.report.ordering import read_floor
from kldtool.textio import write_json

MODEL_KEYS = ("engine", "dtype", "device")


def numeric_path(model: dict, n_seq) -> dict:
    """What decides the arithmetic a model's logits come out of (not the model's path)."""
    return {k: model.get(k) for k in MODEL_KEYS} | {"n_seq": n_seq}


def run_noise_floor(engine, reader, json_path: str | None = None, sinks: Sinks | None = None,
                    chunk_range: tuple[int, int] | None = None, **compare_args) -> dict:
    sinks = sinks or Sinks()
    meta = reader.metadata
    this = numeric_path(engine.describe(), engine.windows_per_call(reader.header.n_ctx))
    base = numeric_path(meta["model"], meta.get("n_seq")) if "model" in meta else None
    if base is None:
        sinks.info(f"noise-floor: note: {reader.path} does not record how its logits were computed; "
                   f"make sure this run's engine, dtype or batch size differ from that run's")
    elif this == base:
        raise UsageError(f"noise-floor: this run would compute the logits exactly as {reader.path}'s base run "
                         f"({', '.join(f'{k} {v}' for k, v in this.items())}): the floor would be 0; change "
                         f"--dtype, --batch-size, --device or --engine")
    result = run_compare(engine, reader, sinks=sinks, chunk_range=chunk_range, **compare_args)
    result["command"] = KIND
    result["noise_floor"] = {"kld_mean": result["statistics"]["kld_mean"], "base_path": base, "this_path": this}
    if json_path:
        write_json(json_path, result)
    return result


def load_floor(path: str, reader) -> dict:
    """The floor of a ``noise-floor --json`` result, checked to belong to ``reader``'s base file."""
    return read_floor(path, base_identity(reader), reader.path)
