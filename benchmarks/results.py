"""The dated row every benchmark appends to benchmarks/RESULTS.md."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEAD = "# Benchmark results\n\n| date | benchmark | figures | ratio | machine |\n|---|---|---|---|---|\n"


def machine() -> str:
    return f"{platform.node()}, {os.cpu_count()} cores"


def append_row(benchmark: str, figures: str, ratio: str, where: str | None = None, path: Path | None = None) -> str:
    path = Path(path or RESULTS)
    line = f"| {datetime.date.today()} | {benchmark} | {figures} | {ratio} | {where or machine()} |"
    if not path.exists():
        path.write_text(HEAD)
    with open(path, "a") as f:
        f.write(line + "\n")
    print(line)
    return line
