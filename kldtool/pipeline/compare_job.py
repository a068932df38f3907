"""A compare run as the command's flags ask for it: one frozen value the CLI builds and
pipeline/compare.py's run reads (a sweep's turns and noise-floor build theirs too)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kldtool.pipeline.checkpoints import Checkpoints
from kldtool.pipeline.compare_inputs import CompareInputs
from kldtool.pipeline.early_stop import Stopping
from kldtool.stats.bootstrap import Bootstrap
from kldtool.text.window_order import FILE_ORDER, Order


@dataclass(kw_only=True, frozen=True)
class CompareJob:
    force: bool = False  # --force: run despite a mismatch that only warns
    json_path: str | None = None
    chunk_range: tuple[int, int] | None = None  # windows a..b-1 of the file (default: all)
    checkpoints: Checkpoints = field(default_factory=Checkpoints)
    per_token_path: str | None = None
    bootstrap: Bootstrap = Bootstrap()
    noise_floor: dict | None = None  # a noise-floor result the mean KLD is set against
    order: Order = FILE_ORDER
    stopping: Stopping = Stopping()
    depth_bins: str | None = None  # --depth-bins (the depth table is kept in any case, printed when given)
    inputs: CompareInputs | None = None  # what compare_files opens (None: the caller opened them)
