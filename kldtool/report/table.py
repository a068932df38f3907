"""The sweep summary table: one column list, rendered to the console (rich), Markdown and CSV.

Markdown and the console print values as llama-perplexity does (same decimals), so a row can be
checked against the compare run's own output; CSV keeps full precision for scripts.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Callable

from kldtool.analysis.results import ResultRow


@dataclass(frozen=True)
class Column:
    name: str  # header in every rendering
    csv: tuple[str, ...]  # CSV field names: the value, and its uncertainty where there is one
    get: Callable[[ResultRow], tuple]  # (value,) or (value, uncertainty)
    fmt: str  # printf format of the value (and the uncertainty) in text renderings
    scale: float = 1.0


def _pair(key: str):
    return lambda r: (r.statistics[key]["value"], r.statistics[key]["uncertainty"])


def _q(key: str):
    return lambda r: (r.statistics["kld_quantiles"].get(key, math.nan),)


def _tv(r: ResultRow) -> tuple:
    """Mean total variation and its ±; NaN for a result written before it was kept."""
    tv = (r.statistics.get("extra") or {}).get("tv")
    return (tv["mean"]["value"], tv["mean"]["uncertainty"]) if tv else (math.nan, math.nan)


def _size(key: str):
    return lambda r: ((r.size or {}).get(key, math.nan),)


COLUMNS = (
    Column("size MiB", ("size_mib",), lambda r: (((r.size or {}).get("file_bytes", math.nan)) / 2**20,), "%.1f"),
    Column("bpw (linear)", ("bpw_linear",), _size("bpw_linear"), "%.3f"),
    Column("bpw (all)", ("bpw_total",), _size("bpw_total"), "%.3f"),
    Column("PPL(Q)", ("ppl_q", "ppl_q_unc"), _pair("ppl_q"), "%.6f"),
    Column("ln(PPL(Q)/PPL(base))", ("ln_ppl_ratio", "ln_ppl_ratio_unc"), _pair("ln_ppl_ratio"), "%.6f"),
    Column("mean KLD", ("kld_mean", "kld_mean_unc"), _pair("kld_mean"), "%.6f"),
    Column("median KLD", ("kld_median",), _q("median"), "%.6f"),
    Column("99% KLD", ("kld_p99",), _q("99.0%"), "%.6f"),
    Column("99.9% KLD", ("kld_p999",), _q("99.9%"), "%.6f"),
    Column("same top %", ("same_top_p", "same_top_p_unc"), _pair("same_top_p"), "%.3f", 100.0),
    Column("RMS Δp %", ("rms_dp", "rms_dp_unc"), _pair("rms_dp"), "%.3f", 100.0),
    Column("mean TV", ("tv_mean", "tv_mean_unc"), _tv, "%.6f"),
)


def _text(c: Column, r: ResultRow) -> str:
    vals = c.get(r)
    if vals[0] is None or math.isnan(vals[0]):
        return "-"
    return " ± ".join(c.fmt % (c.scale * v) for v in vals)


def text_rows(rows: list[ResultRow]) -> tuple[list[str], list[list[str]]]:
    return ["quant", *(c.name for c in COLUMNS)], [[r.label, *(_text(c, r) for c in COLUMNS)] for r in rows]


def markdown(rows: list[ResultRow], title: str | None = None) -> str:
    head, body = text_rows(rows)
    lines = [f"## {title}", ""] if title else []
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines) + "\n"


def csv_text(rows: list[ResultRow]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["quant", "model", "engine", *(f for c in COLUMNS for f in c.csv), "sources"])
    for r in rows:
        vals = [repr(float(v)) if v is not None else "" for c in COLUMNS for v in c.get(r)]
        w.writerow([r.label, r.model.get("model", ""), r.model.get("engine", ""), *vals, " ".join(r.sources)])
    return out.getvalue()


def console(rows: list[ResultRow], title: str | None = None) -> None:
    import sys

    from rich.console import Console
    from rich.table import Table

    head, body = text_rows(rows)
    t = Table(title=title)
    for i, h in enumerate(head):
        t.add_column(h, justify="left" if i == 0 else "right", no_wrap=True)
    for cells in body:
        t.add_row(*cells)
    # Piped into a file or a log, rich would squeeze the table to 80 columns.
    Console(width=None if sys.stdout.isatty() else 400).print(t)
