"""``kldtool noise-floor``: the base model compared against itself run another, equally valid
way (another dtype, batch size, device or engine). Its mean KLD is the smallest difference a
quant can be told apart from, so ``compare --noise-floor`` reports a quant as a multiple of it
and ``report --noise-floor`` labels smaller differences so. The floor's file is written and read
here.
"""

from __future__ import annotations

from kldtool.errors import UsageError
from kldtool.provenance.identity import base_identity
from kldtool.pipeline.sinks import Sinks
from kldtool.pipeline.compare import run_compare
from kldtool.pipeline.compare_job import CompareJob
from kldtool.runtime.small_files import read_json, write_json

MODEL_KEYS = ("engine", "dtype", "device")
KIND = "noise-floor"  # the command name a floor file records


def numeric_path(model: dict, n_seq) -> dict:
    """What decides the arithmetic a model's logits come out of (not the model's path)."""
    return {k: model.get(k) for k in MODEL_KEYS} | {"n_seq": n_seq}


def run_noise_floor(
    engine,
    reader,
    json_path: str | None = None,
    sinks: Sinks | None = None,
    chunk_range: tuple[int, int] | None = None,
    **compare_args,
) -> dict:
    sinks = sinks or Sinks()
    meta = reader.metadata
    f = engine.facts
    this = numeric_path(
        {"engine": f.name, "dtype": f.dtype, "device": f.device}, engine.windows_per_call(reader.header.n_ctx)
    )
    base = numeric_path(meta["model"], meta.get("n_seq")) if "model" in meta else None
    if base is None:
        sinks.info(
            f"noise-floor: note: {reader.path} does not record how its logits were computed; "
            f"make sure this run's engine, dtype or batch size differ from that run's"
        )
    elif this == base:
        raise UsageError(
            f"noise-floor: this run would compute the logits exactly as {reader.path}'s base run "
            f"({', '.join(f'{k} {v}' for k, v in this.items())}): the floor would be 0; change "
            f"--dtype, --batch-size, --device or --engine"
        )
    result = run_compare(engine, reader, CompareJob(chunk_range=chunk_range, **compare_args), sinks)
    result["command"] = KIND
    result["noise_floor"] = {"kld_mean": result["statistics"]["kld_mean"], "base_path": base, "this_path": this}
    if json_path:
        write_json(json_path, result)
    return result


def load_floor(path: str, reader) -> dict:
    """The floor of a ``noise-floor --json`` result, checked to belong to ``reader``'s base file."""
    return read_floor(path, base_identity(reader), reader.path)


def read_floor(path: str, base: dict | None, base_name: str) -> dict:
    """The floor of a ``noise-floor --json`` result, checked to belong to the base file whose
    identity is ``base`` (named ``base_name`` in errors)."""
    floor = read_json(path, f"--noise-floor {path}")
    if not isinstance(floor, dict) or floor.get("command") != KIND or "noise_floor" not in floor:
        raise UsageError(f"--noise-floor {path}: not a `kldtool noise-floor --json` result")
    if floor.get("base") != base:
        raise UsageError(
            f"--noise-floor {path}: measured on another base file than {base_name} (header or tokens differ)"
        )
    return {
        "kld_mean": floor["noise_floor"]["kld_mean"]["value"],
        "source": path,
        "path": floor["noise_floor"]["this_path"],
    }
