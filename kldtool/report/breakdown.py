"""``worst --by depth|kind``: a run's statistics per bucket of tokens, as one table."""

from __future__ import annotations


def breakdown_lines(out: dict) -> list[str]:
    rows = out["rows"]
    width = max(len("bucket"), *(len(r["bucket"]) for r in rows))
    head = (
        f"{'bucket':<{width}}  {'tokens':>8}  {'share':>7}  {'mean KLD':>10}  {'95 % interval':>23}  "
        f"{'99% KLD':>10}  {'same top':>8}  {'RMS Δp':>7}"
    )
    title = "position in the window (log2 buckets)" if out["by"] == "depth" else "kind of the predicted token"
    lines = [f"By {title}, {out['tokens']} tokens of {out['result']}:", head]
    for r in rows:
        name = r["bucket"] + (" *" if r.get("user_class") else "")
        if not r["tokens"]:
            lines.append(f"{name:<{width}}  {0:>8}")
            continue
        iv = r.get("kld_mean_interval_95")  # none from one window: nothing to resample
        shown = f"[{iv[0]:>10.6f}, {iv[1]:>10.6f}]" if iv else f"{'-':>23}"
        lines.append(
            f"{name:<{width}}  {r['tokens']:>8}  {100 * r['share']:>6.2f}%  {r['kld_mean']:>10.6f}  "
            f"{shown}  {r['kld_p99']:>10.6f}  {100 * r['same_top_p']:>7.3f}%  "
            f"{100 * r['rms_dp']:>6.3f}%"
        )
    if any(r.get("user_class") for r in rows):
        lines.append("* a class given with --class (its tokens may also be in other rows)")
    return lines


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
    return "By position in the window" if out["by"] == "depth" else "By kind of the predicted token"


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
