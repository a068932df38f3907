"""``report``'s side-by-side of generated corpora (``kldtool generate``): each corpus's degeneration
figures (analysis/degeneration.py), computed from its own samples, one row per corpus in the
order given (the base's first, then each quant's), labelled by the model that wrote it. The
corpora must come from the same prompts and settings, or the rows would not be comparable."""

from __future__ import annotations

import os

from kldtool.analysis.degeneration import degeneration
from kldtool.errors import UsageError
from kldtool.report.table import console_table, markdown_lines
from kldtool.text.generated import read_generated

HEAD = ["corpus", "model", "engine", "samples", "at limit %", "mean length", "distinct-2", "repeated 4-grams %"]
SAME = ("sampling", "prompts", "chat_template")  # header parts every row must share (a template by its hash)


def corpus_rows(paths: list[str]) -> list[list[str]]:
    """One row of cells per corpus; corpora of other prompts or settings are refused in one line."""
    rows, first = [], None
    for path in paths:
        head, samples = read_generated(path)
        kept = {k: head.get(k) for k in SAME}
        kept["chat_template"] = (kept["chat_template"] or {}).get("sha256")  # not where it came from
        if first is None:
            first = (path, kept)
        elif kept != first[1]:
            differs = next(k for k in SAME if kept[k] != first[1][k])
            raise UsageError(
                f"{path}: its header's {differs!r} differs from {first[0]}'s: not answers to the same prompts"
            )
        d = degeneration([s["ids"] for s in samples], [s["finish"] for s in samples])
        model = (head.get("model") or {}).get("model") or head.get("engine") or "?"
        rows.append(
            [
                os.path.basename(path),
                os.path.basename(str(model).rstrip("/")),
                str(head.get("engine", "?")),
                str(d["samples"]),
                f"{100 * d['at_limit']:.1f}",
                f"{d['mean_length']:.1f}",
                f"{d['distinct_2']:.3f}",
                f"{100 * d['repeated_4gram']:.1f}",
            ]
        )
    return rows


TITLE = "Degeneration of each model's own answers"


def markdown(rows: list[list[str]]) -> str:
    return "\n".join([f"## {TITLE}", "", *markdown_lines(HEAD, rows, left=3)]) + "\n"


def console(rows: list[list[str]]) -> None:
    console_table(HEAD, rows, TITLE, left=3)


def corpora_among(paths: list[str]) -> tuple[list, list[str]]:
    """The rows of the generated corpora among ``paths`` (read and checked before anything is
    printed), and the other paths."""
    from kldtool.text.generated import is_generated

    mine = [p for p in paths if not p.endswith((".h5", ".hdf5")) and is_generated(p)]
    if not mine:
        return [], paths
    return corpus_rows(mine), [p for p in paths if p not in mine]
