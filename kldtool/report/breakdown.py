"""``worst --by depth|kind`` and ``report``'s breakdowns: a run's statistics per bucket of tokens,
one set of cells rendered for the console, Markdown and HTML."""

from __future__ import annotations


COLUMNS = ("bucket", "tokens", "share", "mean KLD", "95 % interval", "99% KLD", "same top", "RMS Δp")


def _cells(r: dict) -> list[str]:
    name = r["bucket"] + (" *" if r.get("user_class") else "")
    if not r["tokens"]:
        return [name, "0"] + [""] * (len(COLUMNS) - 2)
    iv = r.get("kld_mean_interval_95")
    return [
        name,
        str(r["tokens"]),
        f"{100 * r['share']:.2f} %",
        f"{r['kld_mean']:.6f}",
        f"[{iv[0]:.6f}, {iv[1]:.6f}]" if iv else "-",
        f"{r['kld_p99']:.6f}",
        f"{100 * r['same_top_p']:.3f} %",
        f"{100 * r['rms_dp']:.3f} %",
    ]


def _title(out: dict) -> str:
    return "By position in the window (log2 buckets)" if out["by"] == "depth" else "By kind of the predicted token"


def breakdown_lines(out: dict) -> list[str]:
    """The console table: the same cells as Markdown and HTML, in aligned columns."""
    table = [list(COLUMNS)] + [_cells(r) for r in out["rows"]]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    lines = [f"{_title(out)}, {out['tokens']} tokens of {out['result']}:"]
    for row in table:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    if any(r.get("user_class") for r in out["rows"]):
        lines.append("* a class given with --class (its tokens may also be in other rows)")
    return lines


def breakdown_markdown(label: str, out: dict) -> str:
    lines = [f"### {label}: {_title(out).lower()}", "", "| " + " | ".join(COLUMNS) + " |"]
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(COLUMNS) - 1)) + "|")
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in out["rows"]]
    return "\n".join(lines) + "\n"


def breakdown_html(out: dict) -> str:
    import html

    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r)) + "</tr>" for r in out["rows"])
    return (
        f'<h4>{_title(out)}</h4><table class="breakdown" data-by="{out["by"]}">'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )
