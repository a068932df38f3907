"""The table of a checkpoint sweep (``kldtool ppl --checkpoints``): one row per checkpoint, in
step order, with the training loss at its step and the perplexity at each length.

A loss marked ``~`` is from the nearest logged step (named in the JSON's ``loss_step`` and the
CSV's), not the checkpoint's own: helibrunna logs every few steps, and saves its last
checkpoint wherever training ended.
"""

from __future__ import annotations

import csv
import io
import sys


def _lengths(results: list[dict]) -> list[int]:
    return [x["length"] for x in results[0].get("per_length", [])] if results else []


def _ppls(r: dict) -> list[float]:
    return [x["perplexity"] for x in r["per_length"]] if r.get("per_length") else [r["ppl"]]


def _loss(c: dict) -> str:
    if c["training_loss"] is None:
        return "-"
    mark = "" if c["loss_step"] == c["step"] else "~"
    return f"{mark}{c['training_loss']:.4f}"


def print_table(results: list[dict], out=sys.stdout) -> None:
    heads = [f"PPL@{n}" for n in _lengths(results)] or ["PPL"]
    width = max([len("checkpoint")] + [len(r["checkpoint"]["name"]) for r in results])
    out.write(f"{'checkpoint':{width}s}  {'step':>8s}  {'train loss':>10s}  " + "  ".join(f"{h:>10s}" for h in heads))
    out.write("\n")
    for r in results:
        c = r["checkpoint"]
        cells = "  ".join(f"{v:10.4f}" for v in _ppls(r))
        out.write(f"{c['name']:{width}s}  {c['step']:8d}  {_loss(c):>10s}  {cells}\n")
    if any(
        r["checkpoint"]["training_loss"] is not None and r["checkpoint"]["loss_step"] != r["checkpoint"]["step"]
        for r in results
    ):
        out.write("~: the training loss logged nearest to that step (history.json has none at the step itself)\n")
    out.flush()


def csv_text(results: list[dict]) -> str:
    lengths = _lengths(results)
    heads = [f"ppl_{n}" for n in lengths] or ["ppl"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["checkpoint", "step", "training_loss", "loss_step", *heads])
    for r in results:
        c = r["checkpoint"]
        w.writerow(
            [
                c["name"],
                c["step"],
                "" if c["training_loss"] is None else repr(c["training_loss"]),
                "" if c["loss_step"] is None else c["loss_step"],
                *(repr(v) for v in _ppls(r)),
            ]
        )
    return buf.getvalue()
