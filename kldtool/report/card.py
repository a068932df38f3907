"""``report --card FILE``: the Markdown block a quant publisher puts in a model card. One row per
quant, sorted by size, and under the table its receipts: what the numbers were measured against
(the base file's tokens, windows and protocol, the base model where the file names it, the
tokenizer), with what (engines and their versions, kldtool's version, the date) and, for each
row, the command that produced it. Runs whose receipts disagree (another base file, another
tokenizer) are refused: a card states one reference."""

from __future__ import annotations

import json
import math
import shlex

from kldtool.analysis.results import ResultRow
from kldtool.errors import UsageError
from kldtool.report.table import COLUMNS, Column, cell, markdown_lines

# The report table's columns a card shows (report/table.py), after its size in GiB.
SIZE_GIB = Column(
    name="size GiB",
    csv=("size_gib",),
    get=lambda r: ((r.size or {}).get("file_bytes", math.nan) / 2**30,),
    fmt="%.3f",
)
SHOWN = ("bpw (all)", "mean KLD", "99% KLD", "ln(PPL(Q)/PPL(base))", "same top %", "RMS Δp %")
CARD_COLUMNS = (SIZE_GIB, *(c for name in SHOWN for c in COLUMNS if c.name == name))


def _receipt(r: ResultRow, key: str):
    """One receipt of a row: the base file's identity, or the compared model's tokenizer."""
    if key == "base":
        return r.base
    return ((r.run or {}).get("tokenizer_identity") or {}).get("model")


def check_one_reference(rows: list[ResultRow]) -> None:
    """Refuse rows measured against other base files or with other tokenizers, naming the first
    difference."""
    for key, what in (("base", "base file"), ("tokenizer", "tokenizer")):
        ref = rows[0]
        for r in rows[1:]:
            a, b = _receipt(ref, key), _receipt(r, key)
            if a != b:
                differ = _first_difference(a, b)
                raise UsageError(
                    f"report --card: {r.sources[0]} was measured with another {what} than {ref.sources[0]} "
                    f"({differ}); a card states one reference"
                )


def _first_difference(a, b) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return f"{k}: {a.get(k)} against {b.get(k)}"
    return f"{a} against {b}"


def _table(rows: list[ResultRow]) -> list[str]:
    body = [[r.label, *(cell(c, r) for c in CARD_COLUMNS)] for r in rows]
    return markdown_lines(["quant", *(c.name for c in CARD_COLUMNS)], body)


def _base_lines(first: ResultRow) -> list[str]:
    run, base = first.run or {}, first.base or {}
    meta = (run.get("base_file") or {}).get("metadata") or {}
    protocol = run.get("protocol") or first.protocol or {}
    windows = f"{run.get('chunks', base.get('n_chunk'))} windows of {base.get('n_ctx')} tokens"
    lines = [
        f"- Base file: `{_name(run.get('base_file', {}).get('path'))}` "
        f"({(run.get('base_file') or {}).get('format', '?')}), {windows}, protocol {protocol.get('name', '?')}"
        + (f", top-{base['keep']} rows (the KLDs are lower bounds)" if base.get("keep") else "")
        + f"; tokens sha256 `{base.get('tokens_sha256')}`",
    ]
    model = meta.get("model") or {}
    if model:
        source = model.get("source") or {}
        pin = source.get("revision") or source.get("content_sha256") or source.get("files_sha256")
        lines.append(
            f"- Base model: `{model.get('model')}` ({model.get('engine')}, {model.get('dtype')})"
            + (f", `{pin}`" if pin else "")
        )
    else:
        lines.append("- Base model: not recorded in the base file (a llama-perplexity file names none)")
    corpus = meta.get("corpus") or meta.get("source")
    if corpus:
        lines.append(f"- Corpus: {json.dumps(corpus, sort_keys=True)}")
    tok = _receipt(first, "tokenizer")
    lines.append(f"- Tokenizer: `{tok}`" if tok else "- Tokenizer: not recorded")
    return lines


def _name(path) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[-1] if path else "?"


def _row_lines(rows: list[ResultRow]) -> list[str]:
    versions = sorted({str((r.run or {}).get("kldtool_version")) for r in rows})
    dates = sorted(str((r.run or {}).get("created", "?")) for r in rows)
    lines = [
        f"- kldtool {', '.join(versions)}; measured {dates[0]}" + (f" to {dates[-1]}" if dates[-1] != dates[0] else "")
    ]
    for r in rows:
        m = r.model or {}
        engine = f"{m.get('engine')} " + ", ".join(f"{k} {v}" for k, v in (m.get("versions") or {}).items())
        argv = (r.run or {}).get("command_line")
        cmd = f"`{shlex.join(argv)}`" if argv else "not recorded (a result from before kldtool recorded it)"
        lines.append(f"- {r.label}: {engine.strip()}, {m.get('dtype')} on {m.get('device', '?')}; {cmd}")
    return lines


def card(rows: list[ResultRow], title: str | None = None) -> str:
    """The card's Markdown: the table and its receipts (rows sorted by size already)."""
    check_one_reference(rows)
    lines = [f"### {title or 'KL divergence from the base model'}", "", *_table(rows), ""]
    lines += ["Receipts:", "", *_base_lines(rows[0]), *_row_lines(rows), ""]
    return "\n".join(lines)
