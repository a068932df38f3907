"""A compare run as the command's flags ask for it: one frozen value the CLI builds and
pipeline/compare.py's run reads (a sweep's turns and noise-floor build theirs too). It holds
the flags as given; what they resolve to against the base file (the windows, the noise floor)
is worked out by the run (pipeline/file_flags.py), never written back into it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kldtool.engines import EngineOptions
from kldtool.pipeline.checkpoints import Checkpoints
from kldtool.pipeline.early_stop import Stopping
from kldtool.stats.bootstrap import Bootstrap
from kldtool.text.window_order import FILE_ORDER, Order


@dataclass(kw_only=True, frozen=True)
class CompareJob:
    base_path: str | None = None  # --kl-divergence-base: what compare_files opens
    engine: EngineOptions | None = None  # the engine compare_files makes (None: the caller made it)
    force: bool = False  # --force: run despite a mismatch that only warns
    json_path: str | None = None
    per_token_path: str | None = None
    chunks: int | None = None  # --chunks N: the file's first N windows
    chunk_range: str | None = None  # --chunk-range A:B: windows A..B-1 (neither: all of them)
    noise_floor: str | None = None  # --noise-floor: a noise-floor --json result of this base file
    head_from: str | None = None  # --head-from: where an external head is read from
    protocol: tuple = (None, None, None, None)  # --protocol, -c, --stride, --lengths as given
    checkpoints: Checkpoints = field(default_factory=Checkpoints)
    bootstrap: Bootstrap = Bootstrap()
    order: Order = FILE_ORDER
    stopping: Stopping = Stopping()
    depth_bins: str | None = None  # --depth-bins (the depth table is kept in any case, printed when given)
    command_line: tuple[str, ...] = ()  # what the result records to be run again (report --card)
