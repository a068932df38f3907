"""``kldtool attribute``: which layers or tensors of a quant cause its divergence (attribute/)."""

from __future__ import annotations

from typing import Optional

import typer

from kldtool.cli.app import app
from kldtool.cli.flag_groups import BOOTSTRAP, PROGRESS
from kldtool.cli.options import bootstrap_of, flags
from kldtool.runtime.progress import choose as choose_progress
from kldtool.errors import UsageError


@app.command()
@flags(bootstrap_flags=BOOTSTRAP, display=PROGRESS)
def attribute(
    base_model: str = typer.Argument(..., help="The base model: a transformers directory or a GGUF."),
    quant: str = typer.Argument(..., help="The quant: a GGUF (dequantized by transformers) or a checkpoint directory."),
    base_file: Optional[str] = typer.Option(
        None, "--kl-divergence-base", help="The base file whose first windows are the evaluation set."
    ),
    chunks: int = typer.Option(4, "--chunks", help="Windows of the base file to evaluate on."),
    granularity: str = typer.Option(
        "layer",
        "--granularity",
        help="layer (each decoder layer), tensor (each linear) or expert (a mixture's experts, routers, shared experts).",
    ),
    kld: str = typer.Option(
        "in,out", "--kld", help="KLD attribution: in (leave-one-in), out (leave-one-out), in,out or none."
    ),
    budget: Optional[int] = typer.Option(
        None, "--budget", help="KLD attribution for the N units with the largest output errors only (default: all)."
    ),
    dtype: str = typer.Option("float32", "--dtype", help="Both models' dtype: float32, bfloat16 or float64."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N."),
    top: int = typer.Option(20, "--top", help="Rows of the printed ranking (--json has all)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write every unit's figures here."),
    keep: int = typer.Option(0, "--keep", help="The top N units to keep at higher precision (the lists below)."),
    keep_type: str = typer.Option("q8_0", "--keep-type", help="The GGUF type the --tensor-types lines ask for."),
    tensor_types: Optional[str] = typer.Option(
        None,
        "--tensor-types",
        help="Write the --keep units as llama-quantize --tensor-type lines (--tensor-type-file).",
    ),
    ignore_list: Optional[str] = typer.Option(
        None, "--ignore-list", help="Write the --keep units as an llm-compressor ignore list, one a line."
    ),
    plot: Optional[str] = typer.Option(None, "--plot", help="PNG of the attribution by layer."),
    bootstrap_flags=None,
    display=None,
):
    """Rank a quant's layers or tensors: each unit's output error on the base model's own inputs
    (one streamed pass), and the mean KLD against the base file with only that unit quantized
    (leave-one-in) or only that unit restored (leave-one-out)."""
    choose_progress(display.progress)
    from kldtool.attribute.run import parse_modes, run_attribute
    from kldtool.report.attribute import print_table
    from kldtool.runtime.small_files import write_json

    if base_file is None:
        raise UsageError(
            "attribute needs --kl-divergence-base FILE (its first --chunks windows are the evaluation set)"
        )
    if chunks < 2:
        raise UsageError(f"--chunks {chunks}: at least 2 windows (the intervals resample windows)")
    if budget is not None and budget < 1:
        raise UsageError(f"--budget {budget}: at least 1 unit")
    if (tensor_types or ignore_list) and keep < 1:
        raise UsageError("--tensor-types/--ignore-list: give --keep N, the number of units to list")
    result = run_attribute(
        base_model,
        quant,
        base_file,
        chunks,
        granularity,
        dtype,
        device,
        parse_modes(kld),
        budget,
        bootstrap_of(bootstrap_flags),
    )
    print_table(result["units"], top=top)
    if keep:
        from kldtool.attribute.keep import keep_lists
        from kldtool.runtime.small_files import write_text

        result["keep"] = lists = keep_lists(result, keep, keep_type)
        if tensor_types:
            write_text(tensor_types, "".join(line + "\n" for line in lists["tensor_type_lines"]))
        if ignore_list:
            write_text(ignore_list, "".join(line + "\n" for line in lists["ignore"]))
    if json_out:
        write_json(json_out, result)
    if plot:
        from kldtool.report.plots import attribution_by_layer

        attribution_by_layer(result, plot)
