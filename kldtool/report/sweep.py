"""The lines ``kldtool sweep`` prints under its table: how many windows each quant needed, its
mean KLD's interval for all the windows, and why it stopped."""

from __future__ import annotations


def sweep_lines(log: dict) -> list[str]:
    quants = log["quants"]
    rule = log["rule"]
    total = max((q.get("of", 0) for q in quants.values()), default=0)
    used = sum(q["windows"] for q in quants.values())
    head = (
        f"Sweep: {len(quants)} quants, {used} of {total * len(quants)} windows scored "
        f"({used / max(1, total * len(quants)):.0%}); looks at {', '.join(map(str, rule['looks_at']))} windows; "
        f"intervals {rule['level']:.0%} for the mean of all {total} windows over {len(rule['looks_at'])} looks "
        f"(each at {1 - rule['alpha_per_look']:.2%}, Student t):"
    )
    width = max(len(k) for k in quants)
    lines = [head]
    for label, q in sorted(quants.items(), key=lambda kv: kv[1].get("kld_mean", float("inf"))):
        if "kld_mean" not in q:
            lines.append(f"  {label:<{width}}  {q['windows']:>5} windows  {q['stopped']}")
            continue
        lo, hi = q["interval"]
        lines.append(
            f"  {label:<{width}}  {q['windows']:>5} windows  mean KLD {q['kld_mean']:.6f} "
            f"[{lo:.6f}, {hi:.6f}]  {q['stopped']}"
        )
    return lines
