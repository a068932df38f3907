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


@dataclass(kw_only=True, frozen=True)
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
    Column(
        name="size MiB",
        csv=("size_mib",),
        get=lambda r: (((r.size or {}).get("file_bytes", math.nan)) / 2**20,),
        fmt="%.1f",
    ),
    Column(name="bpw (linear)", csv=("bpw_linear",), get=_size("bpw_linear"), fmt="%.3f"),
    Column(name="bpw (all)", csv=("bpw_total",), get=_size("bpw_total"), fmt="%.3f"),
    Column(name="PPL(Q)", csv=("ppl_q", "ppl_q_unc"), get=_pair("ppl_q"), fmt="%.6f"),
    Column(
        name="ln(PPL(Q)/PPL(base))", csv=("ln_ppl_ratio", "ln_ppl_ratio_unc"), get=_pair("ln_ppl_ratio"), fmt="%.6f"
    ),
    Column(name="mean KLD", csv=("kld_mean", "kld_mean_unc"), get=_pair("kld_mean"), fmt="%.6f"),
    Column(name="median KLD", csv=("kld_median",), get=_q("median"), fmt="%.6f"),
    Column(name="99% KLD", csv=("kld_p99",), get=_q("99.0%"), fmt="%.6f"),
    Column(name="99.9% KLD", csv=("kld_p999",), get=_q("99.9%"), fmt="%.6f"),
    Column(name="same top %", csv=("same_top_p", "same_top_p_unc"), get=_pair("same_top_p"), fmt="%.3f", scale=100.0),
    Column(name="RMS Δp %", csv=("rms_dp", "rms_dp_unc"), get=_pair("rms_dp"), fmt="%.3f", scale=100.0),
    Column(name="mean TV", csv=("tv_mean", "tv_mean_unc"), get=_tv, fmt="%.6f"),
)


def cell(c: Column, r: ResultRow) -> str:
    """A row's value of ``c`` as the text renderings print it (``-`` where it is not known)."""
    vals = c.get(r)
    if vals[0] is None or math.isnan(vals[0]):
        return "-"
    return " ± ".join(c.fmt % (c.scale * v) for v in vals)


def text_rows(rows: list[ResultRow]) -> tuple[list[str], list[list[str]]]:
    return ["quant", *(c.name for c in COLUMNS)], [[r.label, *(cell(c, r) for c in COLUMNS)] for r in rows]


def markdown(rows: list[ResultRow], title: str | None = None) -> str:
    lines = [f"## {title}", ""] if title else []
    return "\n".join(lines + markdown_lines(*text_rows(rows))) + "\n"


def markdown_lines(head: list[str], body: list[list[str]], left: int = 1) -> list[str]:
    """A Markdown table: the first ``left`` columns left-aligned, the numbers right-aligned."""
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * left + ["---:"] * (len(head) - left)) + "|"]
    return lines + ["| " + " | ".join(cells) + " |" for cells in body]


def csv_text(rows: list[ResultRow]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["quant", "model", "engine", *(f for c in COLUMNS for f in c.csv), "sources"])
    for r in rows:
        vals = [repr(float(v)) if v is not None else "" for c in COLUMNS for v in c.get(r)]
        w.writerow([r.label, r.model.get("model", ""), r.model.get("engine", ""), *vals, " ".join(r.sources)])
    return out.getvalue()


def console(rows: list[ResultRow], title: str | None = None) -> None:
    console_table(*text_rows(rows), title)


def console_table(head: list[str], body: list[list[str]], title: str | None, left: int = 1) -> None:
    """A table on stdout, its first ``left`` columns left-aligned, the numbers right-aligned."""
    import sys

    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for i, h in enumerate(head):
        t.add_column(h, justify="left" if i < left else "right", no_wrap=True)
    for cells in body:
        t.add_row(*cells)
    # Piped into a file or a log, rich would squeeze the table to 80 columns.
    Console(width=None if sys.stdout.isatty() else 400).print(t)
