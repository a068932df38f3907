"""``kldtool diff``'s table and sentences (analysis/diff.py computes them)."""

from __future__ import annotations

from kldtool.stats.paired import MEASURES

AUDIT_DIFF = "served-audit-diff"  # analysis/served_runs.py's paired result


def print_diff(result: dict) -> None:
    if result.get("kldtool") == AUDIT_DIFF:  # two served models paired by prompt
        from kldtool.report.providers import diff_lines

        print("\n".join(diff_lines(result)))
        return
    a, b = result["a"]["label"], result["b"]["label"]
    rows = result["measures"]
    width = max(12, len(a), len(b))
    print(f"{'':14} {a:>{width}} {b:>{width}} {'A − B':>12}  {'95 % interval':>27}  sig  A wins")
    for m in MEASURES:
        r = rows[m.key]
        lo, hi = r["interval_95"]
        print(
            f"{m.label:14} {r['a']:>{width}.6g} {r['b']:>{width}.6g} {r['difference']:>+12.6g}  "
            f"[{lo:>+12.6g}, {hi:>+12.6g}]  {'yes' if r['significant'] else ' no'}  {r['a_wins']}/{r['chunks']}"
        )
    print()
    for line in result["summary"]:
        print(line)
