"""Issue 68: a 4-quant ``kldtool sweep --ray`` on a Ray cluster of one node, then of two, against
the same sweep without Ray, in one run.

The cluster is real and on this machine: a head node and then a second one, each a process
group with one CPU (tests/helpers/ray_node.py); every engine runs with -t 1, so each node is
one core's worth of work. Prints the wall time of each sweep, the ratio one node / two nodes
(expect about 2 on two single-CPU nodes), Ray's own cost per turn (the one-node sweep less the
sweep without Ray, over its turns) and the round trip of an empty task; checks that all three
sweeps print the same. Appends a row to benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/ray_sweep.py [--ctx 512] [--chunks 64] [--types Q8_0,Q6_K,Q4_K_M,Q2_K]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from base_fixture import ROOT, gguf_sweep_inputs
from results import append_row

CACHE = Path(os.environ.get("KLDTOOL_BENCH_DIR", Path.home() / ".cache" / "kldtool" / "adaptive"))
NODE = ROOT / "tests" / "helpers" / "ray_node.py"
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # the cluster stays on 127.0.0.1


def start_node(*args: str) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, str(NODE), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env=dict(os.environ, **LOOPBACK),
    )
    if not p.stdout.readline().strip():
        raise SystemExit(f"ray node {args} did not start")
    return p


def timed_sweep(base: Path, models: list, out: Path, *extra) -> tuple[float, str, dict]:
    args = ["sweep", "--kl-divergence-base", base, *models, "-o", out, "-t", "1", *extra]
    t = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "kldtool", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, **LOOPBACK),
        check=True,
    )
    return time.perf_counter() - t, p.stdout, json.loads((out / "sweep.json").read_text())


def empty_task_ms(address: str, n: int = 50) -> float:
    """The round trip of a task that does nothing, one after another, in milliseconds."""
    code = (
        "import sys, time, ray\n"
        f"ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False)\n"
        "f = ray.remote(num_cpus=1)(lambda: None)\n"
        "ray.get(f.remote())\n"
        f"t = time.perf_counter()\n"
        f"for _ in range({n}): ray.get(f.remote())\n"
        f"print((time.perf_counter() - t) / {n} * 1000)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, **LOOPBACK), check=True
    )
    return float(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--types", default="Q8_0,Q6_K,Q4_K_M,Q2_K")
    a = ap.parse_args()
    base, quants = gguf_sweep_inputs(CACHE, a.ctx, a.chunks, a.types.split(","))
    models = [x for path in quants.values() for x in ("-m", path)]
    nodes = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        try:
            alone_s, alone_out, log = timed_sweep(base, models, tmp / "alone")
            print(f"without Ray: {alone_s:.1f} s", flush=True)
            nodes.append(start_node("head", str(tmp)))
            address = (tmp / "address").read_text()
            one_s, one_out, _ = timed_sweep(base, models, tmp / "one", "--ray", address)
            print(f"Ray, 1 node: {one_s:.1f} s", flush=True)
            nodes.append(start_node("node", address))
            two_s, two_out, _ = timed_sweep(base, models, tmp / "two", "--ray", address)
            print(f"Ray, 2 nodes: {two_s:.1f} s", flush=True)
            task_ms = empty_task_ms(address)
        finally:
            for p in reversed(nodes):
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    turns = sum(len(r["players"]) for r in log["rounds"])
    windows = sum(q["windows"] for q in log["quants"].values())
    same = alone_out == one_out == two_out
    per_turn = (one_s - alone_s) / turns
    print(
        f"same output: {same}; {turns} turns, {windows} windows; Ray per turn {per_turn:.2f} s; empty task {task_ms:.1f} ms"
    )
    append_row(
        f"sweep --ray, 1 node vs 2 nodes of 1 CPU each (SmolLM2 Q4_1 base, c={a.ctx}, {a.chunks} windows, "
        f"{a.types}, llamacpp -t 1, this machine)",
        f"without Ray {alone_s:.1f} s, Ray 1 node {one_s:.1f} s, 2 nodes {two_s:.1f} s ({turns} turns, {windows} "
        f"windows); Ray's cost per turn {per_turn:.2f} s, an empty task's round trip {task_ms:.1f} ms; "
        f"the three print the same: {same}",
        f"1 node / 2 nodes {one_s / two_s:.2f} (expect about 2)",
    )


if __name__ == "__main__":
    main()
