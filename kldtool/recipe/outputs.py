"""What ``kldtool recipe`` writes beside the GGUF: the costs (JSON and CSV), the frontier (size
against predicted KLD, additive and corrected, with the certificate's bound), the tensor-type
file llama-quantize reads, and a PNG of the frontier. Every file is written atomically."""

from __future__ import annotations

import csv
import io
import os

import numpy as np

from kldtool.recipe.rounds import Problem, chosen
from kldtool.runtime.small_files import write_json, write_text

FRONTIER_POINTS = 256


def cost_rows(p: Problem, cache) -> list[dict]:
    """One row a candidate: measured (its interval), or estimated by --prune (no interval)."""
    rows = []
    for i, (tensor, opts) in enumerate(zip(p.cands.tensors, p.options)):
        for j, asked in enumerate(opts):
            w = p.cands.written[tensor][asked]
            r = cache.get(tensor, w.sha256) or {}
            rows.append({"tensor": tensor, "asked": asked, "written": w.type_name, "bytes": w.nbytes, "sha256": w.sha256,
                         "kld_above_base": r.get("above_base", p.costs[i][j]), "interval_95": r.get("interval_95"),
                         "same_as_source": bool(r.get("source_values")), "measured": bool(r),
                         "weight_error": cache.error(tensor, w.sha256)})  # fmt: skip
    return rows


def frontier(p: Problem, alpha: float) -> list[dict]:
    """Points of the least predicted KLD against size, at most FRONTIER_POINTS, each an answer
    the knapsack can name (its exact bytes), with how many of its candidates are estimated."""
    steps = np.nonzero(np.diff(p.table.best, prepend=np.inf) < 0)[0]
    if len(steps) > FRONTIER_POINTS:
        steps = steps[np.linspace(0, len(steps) - 1, FRONTIER_POINTS).round().astype(int)]
    out: list[dict] = []
    for at in steps:
        c = chosen(p, int(at))
        # Sizes are rounded up to buckets: a later step can name an answer no larger than the one
        # before at a lower cost, which then is no point of the frontier.
        while out and out[-1]["bytes"] >= c["size"]:
            out.pop()
        out.append({"bytes": c["size"], "predicted_additive": p.floor + c["summed_cost"],
                    "predicted": p.floor + alpha * c["summed_cost"], "lower_bound": p.floor + c["lower"],
                    "estimated_candidates": c["estimated"]})  # fmt: skip
    return out


def _csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (" ".join(f"{x:.6g}" for x in v) if isinstance(v, list) else v) for k, v in r.items()})
    return buf.getvalue()


def write_tables(out_dir: str, name: str, rows: list[dict]) -> None:
    write_json(os.path.join(out_dir, f"{name}.json"), {name: rows})
    if rows:
        write_text(os.path.join(out_dir, f"{name}.csv"), _csv(rows))


def tensor_type_file(lines: list[str], default_type: str) -> str:
    head = (
        "# kldtool recipe: one line a tensor, the type llama.cpp writes for its chosen candidate.\n"
        f"# Rebuild: llama-quantize --pure --tensor-type-file THIS SOURCE.gguf OUT.gguf {default_type}\n"
    )
    return head + "".join(line + "\n" for line in lines)


def plot(points: list[dict], built: list[dict], mixes: list[dict], path: str) -> None:
    from kldtool.report.frontier_plot import draw

    draw([{"label": None, "frontier": points, "rounds": built}], mixes, path)
