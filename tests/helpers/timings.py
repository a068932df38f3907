"""Where the suite's time goes, per test file: each file's setup, call and teardown seconds
summed (under xdist's loadfile a file runs on one worker, so this is its wall time there).
The terminal summary names any file over BUDGET_S, a warning to act on and never a failure;
``KLDTOOL_TIMINGS=FILE`` (``scripts/test.sh --timings``) also writes every file's seconds, and
the setup seconds its tests spent on fixtures, as JSON to FILE. tests/conftest.py takes these
hooks as its own."""

from __future__ import annotations

import json
import os
from collections import defaultdict

BUDGET_S = 300.0  # a file over five minutes is named in every run's summary
# Seconds per test file in a full run alone (2026-12-04, 2-core AMD EPYC Zen 3, warm, both
# workers busy; `scripts/test.sh --timings` gives today's): the order files are handed to the
# workers, the longest first, so that no long file starts late and leaves a worker idle at the end.
# Files not listed take under 40 s and follow in collection order.
COSTS = {
    "test_vllm_engine.py": 686,
    "test_vllm_server.py": 649,
    "test_ray_cluster.py": 313,
    "test_vocabularies.py": 287,
    "test_endpoint.py": 233,
    "test_long_context.py": 192,
    "test_attribute.py": 141,
    "test_resume.py": 126,
    "test_xlstm.py": 108,
    "test_protocols.py": 99,
    "test_hidden_gguf.py": 99,
    "test_endpoint_llamacpp.py": 97,
    "test_rolling_protocol.py": 86,
    "test_hub_ids.py": 82,
    "test_moe_routing.py": 81,
    "test_hidden_base.py": 79,
    "test_gpu_check.py": 74,
    "test_reducer_variants.py": 70,
    "test_sweep.py": 69,
    "test_llamacpp_lanes.py": 60,
    "test_endpoint_hostile.py": 51,
    "test_llamacpp_parity.py": 48,
    "test_cross_engine.py": 47,
    "test_adaptive_sweep.py": 46,
    "test_html_report.py": 45,
    "test_served_audit.py": 70,  # 2026-12-06, Zen 4 EPYC, alone
    "test_recipe.py": 110,  # 2026-12-06, Zen 3 EPYC, alone
    "test_recipe_moe.py": 50,
}


def by_cost(items) -> None:
    """Sort collected tests so their files come longest first (stable within a file)."""
    items.sort(key=lambda item: -COSTS.get(item.path.name, 0))


_seconds: dict[str, float] = defaultdict(float)
_setup: dict[str, float] = defaultdict(float)
_tests: dict[str, int] = defaultdict(int)
_span: dict[str, list] = {}  # file -> [first start, last stop, worker]


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _seconds[path] += report.duration
    start, stop = getattr(report, "start", None), getattr(report, "stop", None)
    if start is not None and stop is not None:
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "main")
        span = _span.setdefault(path, [start, stop, worker])
        span[0], span[1] = min(span[0], start), max(span[1], stop)
    if report.when == "setup":
        _setup[path] += report.duration
    elif report.when == "call":
        _tests[path] += 1


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput") or not _seconds:
        return
    over = {p: s for p, s in _seconds.items() if s > BUDGET_S}
    if over:
        terminalreporter.section("test files over their 5-minute budget (docs/testing.md)", yellow=True)
        for p, s in sorted(over.items(), key=lambda x: -x[1]):
            terminalreporter.line(f"{s:8.1f} s  {p}")
    out = os.environ.get("KLDTOOL_TIMINGS")
    if out:
        t0 = min((v[0] for v in _span.values()), default=0.0)
        rows = {
            p: {"seconds": round(s, 2), "setup_s": round(_setup[p], 2), "tests": _tests[p]}
            | (
                {"from_s": round(_span[p][0] - t0, 1), "to_s": round(_span[p][1] - t0, 1), "worker": _span[p][2]}
                if p in _span
                else {}
            )  # fmt: skip
            for p, s in sorted(_seconds.items(), key=lambda x: -x[1])
        }
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"total_s": round(sum(_seconds.values()), 2), "files": rows}, f, indent=1)
        terminalreporter.line(f"per-file timings written to {out}")
