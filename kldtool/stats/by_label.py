"""Mean KLD over groups of windows named by a label each (a generated corpus's answers by how
they ended: ``stop`` or ``length``), from the per-window sums a run keeps."""

from __future__ import annotations

from kldtool.stats.accumulator import KldAccumulator


def kld_by_label(acc: KldAccumulator, labels: list[str]) -> dict:
    """{label: {"windows", "tokens", "kld_mean"}} over the windows ``acc`` scored; ``labels`` is
    indexed by window number."""
    table = acc.chunk_table()
    kld, count = table["columns"].index("kld"), table["columns"].index("count")
    out: dict = {}
    for chunk, vector in zip(table["chunks"], table["vectors"]):
        group = out.setdefault(labels[chunk], {"windows": 0, "tokens": 0, "kld_sum": 0.0})
        group["windows"] += 1
        group["tokens"] += int(vector[count])
        group["kld_sum"] += vector[kld]
    return {
        k: {
            "windows": g["windows"],
            "tokens": g["tokens"],
            "kld_mean": g["kld_sum"] / g["tokens"] if g["tokens"] else None,
        }
        for k, g in sorted(out.items())
    }


def by_label_line(title: str, groups: dict) -> str:
    parts = [
        f"{k} {g['kld_mean']:.6f} ({g['tokens']} tokens, {g['windows']} answers)"
        for k, g in groups.items()
        if g["tokens"]
    ]
    return f"{title}: " + "; ".join(parts)
