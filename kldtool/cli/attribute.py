"""``kldtool attribute``: which layers or tensors of a quant move the model most (attribute/)."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from kldtool.cli.app import app
from kldtool.errors import MismatchError, UsageError


@app.command()
def attribute(
    base_model: str = typer.Argument(..., help="The base model: a transformers directory or a GGUF."),
    quant: str = typer.Argument(..., help="The quant: a GGUF (dequantized by transformers) or a checkpoint directory."),
    base_file: Optional[str] = typer.Option(
        None, "--kl-divergence-base", help="The base file whose first windows are the evaluation set."
    ),
    chunks: int = typer.Option(4, "--chunks", help="Windows of the base file to evaluate on."),
    granularity: str = typer.Option(
        "layer", "--granularity", help="layer (each decoder layer) or tensor (each linear)."
    ),
    dtype: str = typer.Option("float32", "--dtype", help="Both models' dtype: float32, bfloat16 or float64."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N."),
    top: int = typer.Option(20, "--top", help="Rows of the printed ranking (--json has all)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write every unit's errors here."),
):
    """Per-layer (or per-tensor) errors of a quant: each unit's quant version run on the base
    model's own inputs in one streamed pass, ranked by relative RMS of its output."""
    from kldtool.attribute.layer_errors import measure
    from kldtool.attribute.units import find_units
    from kldtool.engines.transformers import TransformersEngine
    from kldtool.logitsfile import open_base_file
    from kldtool.protocols import stored_windows
    from kldtool.small_files import write_json

    if base_file is None:
        raise UsageError(
            "attribute needs --kl-divergence-base FILE (its first --chunks windows are the evaluation set)"
        )
    if chunks < 1:
        raise UsageError(f"--chunks {chunks}: must be at least 1")
    reader = open_base_file(base_file)
    try:
        base = TransformersEngine(base_model, dtype=dtype, device=device)
        if base.n_vocab != reader.header.n_vocab:
            raise MismatchError(
                f"{base_file}: written for a vocabulary of {reader.header.n_vocab}, {base_model} has {base.n_vocab}"
            )
        windows = stored_windows(reader.tokens, reader.header, base.bos_id)[:chunks]
    finally:
        reader.close()
    units = find_units(base.model, TransformersEngine(quant, dtype=dtype, device="cpu").model, granularity)
    tokens = sum(len(w.tokens) for w in windows)
    print(
        f"attribute: {len(units)} {granularity} units the quant changes; cost: {len(windows)} forwards of the base "
        f"model ({tokens} tokens), each unit's quant version once per window (about {len(windows)} forwards more)",
        file=sys.stderr,
        flush=True,
    )
    errors = measure(
        base.model,
        units,
        windows,
        device,
        lambda i, n: print(f"\rwindow {i}/{n}", end="" if i < n else "\n", file=sys.stderr, flush=True),
    )
    rows = [{"name": u.name, "layer": u.layer, "params": u.numel} | errors[u.name] for u in units]
    rows.sort(key=lambda r: -r["rel_rms"])
    from kldtool.report.attribute import print_table

    print_table(rows, top=top)
    if json_out:
        write_json(
            json_out,
            {
                "base_model": base_model,
                "quant": quant,
                "base_file": base_file,
                "windows": len(windows),
                "tokens": tokens,
                "granularity": granularity,
                "dtype": dtype,
                "units": rows,
            },
        )
