"""How honest are early-stopped intervals? A simulation over a full run's per-window sums.

Each simulated run visits the N windows of a real full run in a fresh random order and stops
as kldtool would; its interval then either holds the full-corpus mean KLD (known, since every
window was scored) or misses it. Three rules:

- ``--target-ci REL`` with kldtool's rule (looks at 16, 32, 64, ... windows, Bonferroni z,
  finite-population factor: ``stats/sequential.py``);
- the naive rule it replaces: the same interval for one look (z = 1.96, the standard error
  from the windows' spread by the delta method, the finite-population factor) checked after
  every window from the 16th;
- ``kldtool sweep``'s rounds (``pipeline/sweep.decide``) over all the quants at once: each
  quant's interval and whether the ranking equals the full sweep's.

    .venv/bin/python benchmarks/stopping_coverage.py RESULT.json [RESULT.json ...] [--sims 400]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kldtool.pipeline.sweep import decide  # noqa: E402
from kldtool.stats.accumulator import COUNT, SUMS  # noqa: E402
from kldtool.stats.sequential import Rule, target_met  # noqa: E402

KLD = SUMS.index("kld")
RELS = (0.02, 0.05, 0.10)
FIRST = 16


def _mean(v: np.ndarray) -> float:
    return float(v[:, KLD].sum() / v[:, COUNT].sum())


def inside(iv: list[float], truth: float) -> bool:
    return iv[0] <= truth <= iv[1]


def kldtool_target(v: np.ndarray, perm: np.ndarray, rule: Rule, rel: float) -> tuple[list[float], int]:
    for n in rule.looks:
        facts = rule.interval(v[perm[:n]])
        if target_met(facts, rel):
            return facts["interval"], n
    return [_mean(v)] * 2, len(v)


def naive_target(v: np.ndarray, perm: np.ndarray, first: int, rel: float) -> tuple[list[float], int]:
    kld, cnt = v[perm, KLD], v[perm, COUNT]
    for n in range(first, len(v) + 1):
        k, c = kld[:n], cnt[:n]
        m = k.sum() / c.sum()
        fpc = np.sqrt((len(v) - n) / (len(v) - 1))
        se = fpc * np.sqrt(n / (n - 1) * np.sum((k - m * c) ** 2)) / c.sum()
        if 1.96 * se <= rel * m:
            return [m - 1.96 * se, m + 1.96 * se], n
    return [_mean(v)] * 2, len(v)


def sweep_once(vectors: dict[str, np.ndarray], perm: np.ndarray, rule: Rule) -> dict[str, list]:
    seen = {k: v[perm[: rule.looks[0]]] for k, v in vectors.items()}
    for look in rule.looks[1:]:
        players, _ = decide(seen, rule, None)
        if not players:
            break
        for k in players:
            seen[k] = vectors[k][perm[:look]]
    return {k: rule.interval(v) for k, v in seen.items()}


def report_coverage(vectors: dict[str, np.ndarray], sims: int, first: int = FIRST) -> str:
    """Print every rule's miss rate; return the one-line summary for RESULTS.md."""
    n = len(next(iter(vectors.values())))
    rule = Rule(n, first)
    truth = {k: _mean(v) for k, v in vectors.items()}
    rng = np.random.default_rng(1)
    perms = [rng.permutation(n) for _ in range(sims)]
    parts = []
    for rel in RELS:
        tally = {"kldtool": [0, 0], "naive": [0, 0]}
        for k, v in vectors.items():
            for p in perms:
                for name, (iv, used) in (
                    ("kldtool", kldtool_target(v, p, rule, rel)),
                    ("naive", naive_target(v, p, first, rel)),
                ):
                    tally[name][0] += not inside(iv, truth[k])
                    tally[name][1] += used
        runs = sims * len(vectors)
        line = (
            f"--target-ci {rel}: kldtool misses {tally['kldtool'][0] / runs:.1%} "
            f"(mean {tally['kldtool'][1] / runs:.0f} of {n} windows), naive misses {tally['naive'][0] / runs:.1%} "
            f"(mean {tally['naive'][1] / runs:.0f})"
        )
        print(line, flush=True)
        parts.append(line)
    misses = ranked = used = 0
    order = sorted(truth, key=truth.get)
    for p in perms:
        got = sweep_once(vectors, p, rule)
        misses += sum(not inside(got[k]["interval"], truth[k]) for k in got)
        ranked += sorted(got, key=lambda k: got[k]["kld_mean"]) == order
        used += sum(g["windows"] for g in got.values())
    line = (
        f"sweep: intervals miss {misses / (sims * len(vectors)):.1%}, ranking as the full sweep in "
        f"{ranked / sims:.1%} of {sims} orders, {used / (sims * len(vectors) * n):.1%} of the windows"
    )
    print(line, flush=True)
    parts.append(line)
    return "coverage over " + str(sims) + " random orders: " + "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+", help="full compare --json results over one base file")
    ap.add_argument("--sims", type=int, default=400)
    ap.add_argument("--first", type=int, default=FIRST)
    a = ap.parse_args()
    vectors = {
        Path(p).stem: np.asarray(json.loads(Path(p).read_text())["chunk_sums"]["vectors"], np.float64)
        for p in a.results
    }
    report_coverage(vectors, a.sims, a.first)


if __name__ == "__main__":
    main()
