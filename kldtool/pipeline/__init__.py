"""The two phases: write a base file, and compare a model against one."""

from kldtool.pipeline.compare import run_compare
from kldtool.pipeline.write_base import run_base

__all__ = ["run_base", "run_compare"]
