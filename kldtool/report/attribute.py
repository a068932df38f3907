"""The table of ``kldtool attribute``: units ranked by how far the quant's version of each moves
its output, on the base model's own inputs."""

from __future__ import annotations

import sys


def print_table(units: list[dict], out=sys.stdout, top: int | None = None) -> None:
    shown = units[:top] if top else units
    width = max([len("unit")] + [len(u["name"]) for u in shown])
    out.write(
        f"{'rank':>4s}  {'unit':{width}s}  {'layer':>5s}  {'params':>9s}  {'rel RMS':>9s}  {'cosine':>9s}  {'SQNR dB':>8s}\n"
    )
    for i, u in enumerate(shown, 1):
        layer = "-" if u["layer"] is None else str(u["layer"])
        out.write(
            f"{i:4d}  {u['name']:{width}s}  {layer:>5s}  {u['params']:9d}  {u['rel_rms']:9.6f}  "
            f"{u['cosine']:9.6f}  {u['sqnr_db']:8.2f}\n"
        )
    if top and len(units) > top:
        out.write(f"... {len(units) - top} more in --json\n")
    out.flush()
