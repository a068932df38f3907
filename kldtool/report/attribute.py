"""The table of ``kldtool attribute``: units in rank order with their output errors and, where
measured, the mean KLD with only that unit quantized, above the base model's own floor (KLD
in), and the KLD its restoration removes from the whole quant (gain out), each with its paired
95 % interval."""

from __future__ import annotations

import sys


def _kld(r: dict | None, key: str) -> str:
    if r is None:
        return "-"
    lo, hi = r["interval_95"]
    return f"{r[key]:.6f} [{lo:.6f}, {hi:.6f}]"


def print_table(units: list[dict], out=sys.stdout, top: int | None = None) -> None:
    shown = units[:top] if top else units
    width = max([len("unit")] + [len(u["name"]) for u in shown])
    kin = [_kld(u.get("in"), "above_base") for u in shown]
    kout = [_kld(u.get("out"), "gain") for u in shown]
    wi, wo = max(map(len, kin + ["KLD in"])), max(map(len, kout + ["gain out"]))
    out.write(
        f"{'rank':>4s}  {'unit':{width}s}  {'layer':>5s}  {'params':>9s}  {'rel RMS':>9s}  {'cosine':>9s}  "
        f"{'SQNR dB':>8s}  {'KLD in':>{wi}s}  {'gain out':>{wo}s}\n"
    )
    for i, (u, a, b) in enumerate(zip(shown, kin, kout), 1):
        layer = "-" if u["layer"] is None else str(u["layer"])
        out.write(
            f"{i:4d}  {u['name']:{width}s}  {layer:>5s}  {u['params']:9d}  {u['rel_rms']:9.6f}  "
            f"{u['cosine']:9.6f}  {u['sqnr_db']:8.2f}  {a:>{wi}s}  {b:>{wo}s}\n"
        )
    if top and len(units) > top:
        out.write(f"... {len(units) - top} more in --json\n")
    out.flush()
