"""The dated row every benchmark appends to benchmarks/RESULTS.md."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEAD = "# Benchmark results\n\n| date | benchmark | figures | ratio | machine |\n|---|---|---|---|---|\n"


def machine() -> str:
    """The host, its cores and, where Linux names them, the CPU's model and widest vector unit:
    this project's CPU machines change kind between sessions (AVX2 EPYCs, AVX-512 Xeons), and
    figures from one kind do not compare with the other's."""
    return ", ".join([platform.node(), f"{os.cpu_count()} cores", *_cpu()])


def _cpu() -> list[str]:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    vector = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2")) if flag in flags), None)
    return [v for v in (fields.get("model name"), vector) if v]


def append_row(benchmark: str, figures: str, ratio: str, where: str | None = None, path: Path | None = None) -> str:
    path = Path(path or RESULTS)
    line = f"| {datetime.date.today()} | {benchmark} | {figures} | {ratio} | {where or machine()} |"
    if not path.exists():
        path.write_text(HEAD)
    with open(path, "a") as f:
        f.write(line + "\n")
    print(line)
    return line
