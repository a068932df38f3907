"""One table for ``kldtool ppl`` over several models (a checkpoint sweep), in run order."""

from __future__ import annotations

import csv
import io
import sys

COLUMNS = ("model", "ppl", "ppl_uncertainty", "ln_ppl", "scored_tokens", "bits_per_byte", "word_perplexity")


def _row(r: dict) -> dict:
    text = r.get("text", {})
    return {
        "model": r["model"].get("model"),
        "ppl": r["ppl"],
        "ppl_uncertainty": r["ppl_uncertainty"],
        "ln_ppl": r["ln_ppl"],
        "scored_tokens": r["scored_tokens"],
        "bits_per_byte": text.get("bits_per_byte", ""),
        "word_perplexity": text.get("word_perplexity", ""),
    }


def print_table(results: list[dict], out=sys.stdout) -> None:
    rows = [_row(r) for r in results]
    width = max(len(str(r["model"])) for r in rows)
    out.write(f"{'model':{width}s}  {'PPL':>10s}  {'±':>9s}  {'tokens':>8s}  {'bits/byte':>9s}\n")
    for r in rows:
        bpb = f"{r['bits_per_byte']:.5f}" if r["bits_per_byte"] != "" else "-"
        out.write(
            f"{str(r['model']):{width}s}  {r['ppl']:10.4f}  {r['ppl_uncertainty']:9.5f}  "
            f"{r['scored_tokens']:8d}  {bpb:>9s}\n"
        )
    out.flush()


def csv_text(results: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in results:
        w.writerow({k: repr(v) if isinstance(v, float) else v for k, v in _row(r).items()})
    return buf.getvalue()
