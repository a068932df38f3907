"""``kldtool noise-floor``: the base model compared against itself run another, equally valid
way (another dtype, batch size, device or engine). Its mean KLD is the smallest difference a
quant can be told apart from, so ``compare --noise-floor`` reports a quant as a multiple of it
and ``report --noise-floor`` labels smaller differences so (the floor's file: floor_file.py).
"""

from __future__ import annotations

from kldtool.errors import UsageError
from kldtool.pipeline.sinks import Sinks
from kldtool.pipeline.compare import run_compare
from kldtool.pipeline.compare_job import CompareJob
from kldtool.pipeline.floor_file import mark_floor
from kldtool.provenance.manifest import backend_change
from kldtool.runtime.small_files import write_json

MODEL_KEYS = ("engine", "dtype", "device")


def numeric_path(model: dict, n_seq) -> dict:
    """What decides the arithmetic a model's logits come out of (not the model's path)."""
    return {k: model.get(k) for k in MODEL_KEYS} | {"n_seq": n_seq}


def run_noise_floor(
    engine,
    reader,
    json_path: str | None = None,
    sinks: Sinks | None = None,
    chunks: int | None = None,
    force: bool = False,
    **compare_args,
) -> dict:
    sinks = sinks or Sinks()
    meta = reader.metadata
    f = engine.facts
    changed = backend_change(meta.get("manifest"), f)
    if changed and not force:
        # A floor is the noise of the path the quants are compared on; across backends it is
        # the backends' difference instead, and would hide quants smaller than that.
        raise UsageError(
            f"noise-floor: {reader.path}: {changed}; run it on the base file's backend, or --force to "
            f"take their difference as the floor"
        )
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
    result = run_compare(engine, reader, CompareJob(chunks=chunks, **compare_args), sinks)
    mark_floor(result, base, this)
    if json_path:
        write_json(json_path, result)
    return result
