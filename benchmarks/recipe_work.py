"""What recipe_frontier.py and recipe_costs.py share: one work directory, one base file of the
fp32 model over WikiText-2 (so a cost cache one of them fills serves the other), the same flags."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wikitext-2" / "wiki.test.txt"


def kldtool(*args) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "kldtool", *map(str, args)], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"kldtool {' '.join(map(str, args))} failed:\n{p.stderr[-3000:]}")
    return p


def arguments(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    ap.add_argument("--work", type=Path, default=Path("/tmp/kldtool-recipe-frontier"))
    ap.add_argument("-c", type=int, default=128)
    ap.add_argument("--windows", type=int, default=48)
    ap.add_argument("--cost-windows", type=int, default=8)
    return ap


def base_file(a: argparse.Namespace) -> Path:
    """The work directory's base file, made once: the fp32 model through transformers."""
    a.work.mkdir(parents=True, exist_ok=True)
    base = a.work / "base.kldt"
    if not base.exists():
        kldtool("base", "--engine", "transformers", "-f", WIKI, "-c", a.c, "--chunks", a.windows,
                "--kl-divergence-base", base, "--progress", "none")  # fmt: skip
    return base
