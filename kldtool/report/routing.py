"""compare's MoE routing block (routing/stats.py's summary as text), and report's Markdown
table of it over many runs."""

from __future__ import annotations


def routing_lines(summary: dict) -> list[str]:
    s, n = summary["shape"], summary["positions"]
    lines = [
        "",
        f"====== MoE routing: {n} positions, {len(s['layers'])} routed layers, {s['k']} of {s['n_experts']} experts ======",
        "layer   flipped  overlap   router KL",
    ]
    for row in summary["layers"]:
        kl = "-" if row["router_kl"] is None else f"{row['router_kl']:.3e}"
        lines.append(f"{row['layer']:5d}  {100 * row['flip_share']:7.3f}%  {row['mean_overlap']:7.4f}  {kl:>10s}")
    for side, words in (("changed", "in some layer"), ("unchanged", "in no layer  ")):
        d = summary["kld_split"][side]
        mean = "-" if d["kld_mean"] is None else f"{d['kld_mean']:.6f}"
        bar = f" [{d['interval_95'][0]:.6f}, {d['interval_95'][1]:.6f}]" if d["interval_95"] else ""
        share = "-" if d["kld_share"] is None else f"{100 * d['kld_share']:.2f}%"
        lines.append(
            f"Routing changed {words}: {d['tokens']:7d} tokens ({100 * d['share']:6.2f}%), "
            f"mean KLD {mean}{bar}, {share} of the KLD"
        )
    first = " | ".join(f"{k}: {v}" for k, v in summary["first_departing_layer"].items())
    lines.append(f"First departing layer: {first}")
    return lines


def routing_markdown(rows) -> str:
    """Per routed layer, each run's share of positions whose experts differ ("" without routing)."""
    runs = [(r.label, r.statistics["routing"]) for r in rows if r.statistics.get("routing")]
    if not runs:
        return ""
    layers = sorted({x["layer"] for _, s in runs for x in s["layers"]})
    share = {(label, x["layer"]): x["flip_share"] for label, s in runs for x in s["layers"]}
    lines = ["", "### MoE routing: positions whose experts differ from the base's", ""]
    lines.append("| layer | " + " | ".join(label for label, _ in runs) + " |")
    lines.append("|---:|" + "---:|" * len(runs))
    for layer in layers:
        cells = (f"{100 * share[(label, layer)]:.2f} %" if (label, layer) in share else "" for label, _ in runs)
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    changed = (f"{100 * s['kld_split']['changed']['share']:.2f} %" for _, s in runs)
    lines.append("| any layer | " + " | ".join(changed) + " |")
    return "\n".join(lines) + "\n"
