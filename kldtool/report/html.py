"""``kldtool report ... --html FILE``: one self-contained page (no network: plots inlined as
PNG data, no scripts) with the table, the paired comparisons, the plots, each run's manifest
and, for every model given as a per-token file, its worst windows as text: each token shaded by
its KLD, and hovering a token shows the target, both models' probability of it and both top-1
tokens (CSS only, so the page works wherever it is opened)."""

from __future__ import annotations

import base64
import html
import os
import tempfile

from kldtool.report import table
from kldtool.analysis.results import ResultRow
from kldtool.provenance.manifest import NUMERIC

WINDOWS = 2  # worst windows shown per model
FULL_SHADE_KLD = 1.0  # a token at or above this KLD gets the darkest shade

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:13px}th,td{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left}
.pairs li{font-family:monospace;font-size:13px}
.tokens{font-family:monospace;font-size:14px;line-height:2;white-space:pre-wrap;border:1px solid #ccc;padding:8px}
.tok{position:relative;border-radius:2px}
.tok .tip{display:none;position:absolute;left:0;top:1.8em;z-index:5;background:#333;color:#fff;padding:4px 8px;
 border-radius:4px;white-space:pre;font-size:12px;line-height:1.4}
.tok:hover .tip{display:block}
img{max-width:640px;margin:8px 8px 8px 0;border:1px solid #eee}
"""


def _table(rows: list[ResultRow]) -> str:
    return table_html(*table.text_rows(rows), "summary")


def _manifests(rows: list[ResultRow]) -> str:
    """How each run's numbers were computed (kldtool/provenance/manifest.py)."""
    fields = ("engine", "versions", *NUMERIC)

    def cell(v) -> str:
        return ", ".join(f"{k} {x}" for k, x in v.items()) if isinstance(v, dict) else str(v)

    body = [[r.label, *(cell((r.manifest or {}).get(f, "-")) for f in fields)] for r in rows]
    return table_html(["quant", *fields], body, "manifests")


def image(path: str, alt: str) -> str:
    """A PNG inlined as data: the page fetches nothing."""
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def table_html(head: list[str], body: list[list[str]], ident: str) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>" for cells in body)
    return f'<table id="{ident}"><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>'


def page(title: str, body: list[str]) -> str:
    name = html.escape(title)
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{name}</title>'
        f"<style>{STYLE}</style></head><body><h1>{name}</h1>{''.join(body)}</body></html>"
    )


def _plots(rows: list[ResultRow]) -> str:
    from kldtool.report.plots import write_plots

    with tempfile.TemporaryDirectory() as d:
        return "".join(image(p, os.path.basename(p)) for p in write_plots(rows, d))


def _token(text: str, kld: float, tip: str) -> str:
    alpha = min(1.0, max(0.0, kld) / FULL_SHADE_KLD)
    return (
        f'<span class="tok" data-kld="{kld:.6g}" style="background:rgba(220,40,40,{alpha:.3f})">'
        f'{html.escape(text)}<span class="tip">{html.escape(tip)}</span></span>'
    )


def _windows(views) -> str:
    """A model's worst windows by mean KLD, token by token (analysis.worst.window_views), or why
    there are none (a moved base file or model: the page still has everything else)."""
    if isinstance(views, str):
        return f"<p>token view unavailable: {html.escape(views)}</p>"
    parts = []
    for chunk, mean, toks in views:
        spans = [
            _token(
                t.text,
                t.kld,
                f"target {t.target!r}\np_base {t.p_base:.4f}  p_q {t.p_q:.4f}\nKLD {t.kld:.5f}"
                f"\ntop-1 base {t.top1_base!r}  top-1 q {t.top1_q!r}",
            )
            for t in toks
        ]
        parts.append(f'<h4>chunk {chunk + 1}: mean KLD {mean:.6f}</h4><div class="tokens">{"".join(spans)}</div>')
    return "".join(parts)


def _splits(splits) -> str:
    """A model's breakdowns by depth and kind (report/breakdown.py), or why there are none."""
    from kldtool.report.breakdown import breakdown_html

    if isinstance(splits, str):
        return f"<p>breakdowns unavailable: {html.escape(splits)}</p>"
    return "".join(breakdown_html(out) for out in splits)


def render(
    rows: list[ResultRow],
    pairs: list[str],
    title: str | None,
    views: list[tuple[ResultRow, object]],
    splits: list[tuple[ResultRow, object]] = (),
) -> str:
    """The page; ``views``: per model given as a per-token file, its worst windows
    (analysis.worst.window_views) or why they are unavailable; ``splits``: its breakdowns."""
    body = [_table(rows)]
    if pairs:
        body.append(
            f'<h2>Paired comparisons</h2><p>{html.escape(pairs[0])}</p><ul class="pairs">'
            + "".join(f"<li>{html.escape(p.strip())}</li>" for p in pairs[1:])
            + "</ul>"
        )
    body.append(f"<h2>Plots</h2>{_plots(rows)}")
    body.append(f"<h2>How each run was computed</h2>{_manifests(rows)}")
    if splits:
        body.append("<h2>Where the divergence is</h2>")
        body += [f'<section class="split"><h3>{html.escape(r.label)}</h3>{_splits(v)}</section>' for r, v in splits]
    if views:
        body.append(
            "<h2>Worst windows</h2><p>Each token shaded by its KLD (darkest at "
            f"{FULL_SHADE_KLD:g} nats and above); hover a token for its values.</p>"
        )
        body += [f'<section class="model"><h3>{html.escape(r.label)}</h3>{_windows(v)}</section>' for r, v in views]
    return page(title or "kldtool report", body)
