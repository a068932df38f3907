"""The depth table compare prints after llama.cpp's blocks (``--depth-bins``): one line per
bucket of the predicted token's position in its window."""

from __future__ import annotations

from kldtool.report.console import cf


def depth_lines(table: dict | None, bound: bool = False, origin: str = "window") -> list[str]:
    """``bound``: the KLD is a lower bound (an endpoint run's), labelled ≥ as llama.cpp's blocks
    are; ``origin``: what depths count from, the window's start or (a generated corpus's) the answer's."""
    if not table or not table["rows"]:
        return []
    ge = " ≥" if bound else "  "
    lines = [
        f"====== kldtool: KLD by depth (position in the {origin}) ======",
        f"depth              tokens     share    mean KLD{ge}  [95 % interval]          ln PPL ratio"
        "   RMS Δp    same top p",
    ]
    for r in table["rows"]:
        lo, hi = r.get("kld_mean_interval_95") or (None, None)
        interval = f"[{cf('%.6f', lo)}, {cf('%.6f', hi)}]" if lo is not None else "-"
        lines.append(
            f"{r['bucket']:<15} {r['tokens']:>9d}  {cf('%6.2f', 100 * r['share'])} %   {cf('%10.6f', r['kld_mean'])}"
            f"  {interval:<24}  {cf('%10.6f', r['ln_ppl_ratio'])}  {cf('%6.3f', 100 * r['rms_dp'])} %"
            f"  {cf('%8.3f', 100 * r['same_top_p'])} %"
        )
    lines.append("")
    return lines
