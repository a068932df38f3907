"""PNG plots of a sweep (matplotlib, headless): what a person looks at to pick a quant.

- ``kld_vs_bpw.png``: mean and 99 % KLD against bits per weight, log y;
- ``ppl_ratio_vs_bpw.png``: PPL(Q)/PPL(base) against bits per weight, with its ±;
- ``kld_histograms.png``: each quant's KLD distribution (log-spaced bins);
- ``kld_by_depth.png``: mean KLD by the predicted token's position in its window, one line a run;
- ``ppl --protocol documents --plot FILE``: PPL against context length, one line per model.
"""

from __future__ import annotations

import math
import os

import numpy as np

from kldtool.errors import OutputError, UsageError
from kldtool.logitsfile.atomic import AtomicFile
from kldtool.analysis.results import ResultRow

DPI = 120


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UsageError("plots need matplotlib: pip install 'kldtool[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _sized(rows: list[ResultRow]) -> list[ResultRow]:
    return [r for r in rows if r.bpw is not None and not math.isnan(r.bpw)]


def _title(ax, text: str, rows: list[ResultRow]) -> None:
    proto = (rows[0].protocol or {}) if rows else {}
    where = f"{proto.get('name', '?')} protocol, n_ctx {proto.get('n_ctx', '?')}" if proto else ""
    ax.set_title(f"{text}\n{where}" if where else text, fontsize=10)


def _annotate(ax, xs, ys, labels) -> None:
    for x, y, label in zip(xs, ys, labels):
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)


def kld_vs_bpw(plt, rows: list[ResultRow], path: str) -> None:
    rows = _sized(rows)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = [r.bpw for r in rows]
    mean = [r.statistics["kld_mean"]["value"] for r in rows]
    p99 = [r.statistics["kld_quantiles"]["99.0%"] for r in rows]
    ax.errorbar(
        x, mean, yerr=[r.statistics["kld_mean"]["uncertainty"] for r in rows], fmt="o-", capsize=3, label="mean KLD"
    )
    ax.plot(x, p99, "s--", label="99 % KLD")
    _annotate(ax, x, mean, [r.label for r in rows])
    ax.set_yscale("log")
    ax.set_xlabel("bits per weight (decoder linear layers)")
    ax.set_ylabel("KL divergence (nats)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    _title(ax, "KL divergence from the base model vs size", rows)
    _save(fig, path)


def ppl_ratio_vs_bpw(plt, rows: list[ResultRow], path: str) -> None:
    rows = _sized(rows)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = [r.bpw for r in rows]
    y = [r.statistics["ppl_ratio"]["value"] for r in rows]
    ax.errorbar(
        x,
        y,
        yerr=[r.statistics["ppl_ratio"]["uncertainty"] for r in rows],
        fmt="o-",
        capsize=3,
        label="PPL(Q)/PPL(base)",
    )
    ax.axhline(1.0, color="grey", lw=0.8, ls=":", label="base (ratio 1)")
    _annotate(ax, x, y, [r.label for r in rows])
    ax.set_xlabel("bits per weight (decoder linear layers)")
    ax.set_ylabel("PPL(Q) / PPL(base)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    _title(ax, "Perplexity ratio vs size", rows)
    _save(fig, path)


def kld_histograms(plt, rows: list[ResultRow], path: str) -> None:
    rows = [r for r in rows if "kld_histogram" in r.statistics]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        h = r.statistics["kld_histogram"]
        edges, counts = np.asarray(h["edges"]), np.asarray(h["counts"], np.float64)
        total = counts.sum() + h["below"] + h["above"]
        ax.stairs(counts / max(total, 1), edges, label=f"{r.label} (< 1e-7: {h['below'] / max(total, 1):.1%})")
    ax.set_xscale("log")
    _finish(ax, "per-token KL divergence (nats, log-spaced bins)", "share of scored tokens per bin")
    _title(ax, "Distribution of per-token KLD", rows)
    _save(fig, path)


def kld_by_depth(plt, rows: list[ResultRow], path: str) -> None:
    """Mean KLD in each depth bucket (with its 95 % chunk-bootstrap interval) at the bucket's
    middle depth, one line per run: where in a long window a quant or a KV-cache type diverges."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    positive, xs = True, []
    for r in rows:
        buckets = (r.statistics.get("depth") or {}).get("rows") or []
        if not buckets:
            continue
        x = [(b["depths"][0] + b["depths"][1]) / 2 for b in buckets]
        y = [b["kld_mean"] for b in buckets]
        spans = [b.get("kld_mean_interval_95") or (m, m) for b, m in zip(buckets, y)]
        err = [[max(m - lo, 0) for m, (lo, _) in zip(y, spans)], [max(hi - m, 0) for m, (_, hi) in zip(y, spans)]]
        ax.errorbar(x, y, yerr=err, fmt="o-", capsize=3, label=r.label)
        positive, xs = positive and min(y) > 0, xs + x
    if max(xs) >= 4 * min(xs):  # a log axis over less than a factor 4 shows no ticks
        ax.set_xscale("log", base=2)
    if positive:
        ax.set_yscale("log")
    _finish(
        ax,
        "depth: the predicted token's position in its window (bucket middle)",
        "mean KLD (95 % chunk bootstrap)",
    )
    _title(ax, "KLD by depth", rows)
    _save(fig, path)


def routing_flips(plt, rows: list[ResultRow], path: str) -> None:
    """Per routed layer, the share of scored positions whose expert set differs from the
    base's, one line per run of a mixture of experts."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        layers = (r.statistics.get("routing") or {}).get("layers") or []
        if layers:
            ax.plot([x["layer"] for x in layers], [100 * x["flip_share"] for x in layers], "o-", label=r.label)
    ax.xaxis.get_major_locator().set_params(integer=True)
    _finish(ax, "decoder layer", "positions whose experts differ from the base's (%)")
    _title(ax, "MoE routing flips by layer", rows)
    _save(fig, path)


def _finish(ax, xlabel: str, ylabel: str) -> None:
    """Axis labels, a light grid and the legend, as every per-run plot has them."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def _save(fig, path: str) -> None:
    fig.tight_layout()
    f = AtomicFile(path)
    try:
        fig.savefig(f, format="png", dpi=DPI)
    except BaseException:
        f.abort()
        raise
    f.commit()
    fig.clf()


def ppl_vs_length(results: list[dict], path: str) -> None:
    """``kldtool ppl`` documents runs: PPL (with its ±) at each length, one line per model."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        rows = [x for x in r.get("per_length", []) if x["tokens"]]
        ax.errorbar(
            [x["length"] for x in rows],
            [x["ppl"] for x in rows],
            yerr=[x["ppl_uncertainty"] for x in rows],
            fmt="o-",
            capsize=3,
            label=r["model"].get("name") or os.path.basename(str(r["model"].get("model")).rstrip("/")),
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length N (first N tokens of each document)")
    ax.set_ylabel("perplexity")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    counted = bool(results) and results[0]["protocol"].get("shorter_documents") == "counted"
    shorter = "count with all their tokens" if counted else "skipped"
    ax.set_title(f"Perplexity vs context length\ndocuments protocol, documents shorter than N {shorter}", fontsize=10)
    _save(fig, path)
    plt.close("all")


def loss_vs_ppl(results: list[dict], path: str) -> None:
    """A checkpoint sweep: validation PPL (each length a series) against the training loss
    logged at each checkpoint's step, points labelled by step."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = [r for r in results if r["checkpoint"]["training_loss"] is not None]
    if not rows:
        raise UsageError("--plot: the run's history.json has no training loss to plot against")
    series = [
        (x["length"], lambda r, i=i: r["per_length"][i]["ppl"]) for i, x in enumerate(rows[0].get("per_length", []))
    ]
    for label, value in series or [("all", lambda r: r["ppl"])]:
        xs = [r["checkpoint"]["training_loss"] for r in rows]
        ys = [value(r) for r in rows]
        ax.plot(xs, ys, "o-", label=f"N = {label}" if label != "all" else "validation")
        _annotate(ax, xs, ys, [str(r["checkpoint"]["step"]) for r in rows])
    ax.set_xlabel("training loss at the checkpoint's step (nearest logged step)")
    ax.set_ylabel("validation perplexity")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Training loss vs validation perplexity, one point per checkpoint (labels: step)", fontsize=10)
    _save(fig, path)
    plt.close("all")


def write_plots(rows: list[ResultRow], out_dir: str) -> list[str]:
    """Every plot the rows allow; returns the paths written."""
    plt = _pyplot()
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{out_dir}: cannot make the plot directory ({e.strerror})") from None
    written = []
    plans = [
        ("kld_vs_bpw.png", kld_vs_bpw, len(_sized(rows)) > 0),
        ("ppl_ratio_vs_bpw.png", ppl_ratio_vs_bpw, len(_sized(rows)) > 0),
        ("kld_histograms.png", kld_histograms, any("kld_histogram" in r.statistics for r in rows)),
        ("kld_by_depth.png", kld_by_depth, any((r.statistics.get("depth") or {}).get("rows") for r in rows)),
        ("routing_flips.png", routing_flips, any(r.statistics.get("routing") for r in rows)),
    ]
    for name, draw, possible in plans:
        if possible:
            path = os.path.join(out_dir, name)
            draw(plt, rows, path)
            written.append(path)
    plt.close("all")
    return written


def attribution_by_layer(result: dict, path: str) -> None:
    """``kldtool attribute``: per decoder layer, the leave-one-out gain (else the leave-one-in
    KLD, else the output's relative RMS), summed over the layer's units (with their intervals
    where a layer is one unit)."""
    plt = _pyplot()
    units = [u for u in result["units"] if u["layer"] is not None]
    if any("out" in u for u in units):
        label, value = "KLD removed by restoring it (leave-one-out gain)", lambda u: u["out"]["gain"]
        units = [u for u in units if "out" in u]
    elif any("in" in u for u in units):
        label, value = "mean KLD with only it quantized (leave-one-in)", lambda u: u["in"]["kld_mean"]
        units = [u for u in units if "in" in u]
    else:
        label, value = "relative RMS of its output", lambda u: u["rel_rms"]
    layers = sorted({u["layer"] for u in units})
    totals = [sum(value(u) for u in units if u["layer"] == n) for n in layers]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar(layers, totals, color="#3b75af")
    ax.set_xlabel("decoder layer")
    ax.set_ylabel(label)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(
        f"Attribution by layer ({result['granularity']} units, {result['windows']} windows)\n"
        f"{os.path.basename(str(result['quant']))} against {os.path.basename(str(result['base_model']).rstrip('/'))}",
        fontsize=10,
    )
    _save(fig, path)
    plt.close("all")
