"""A base run as the command's flags ask for it: one frozen value the CLI builds and the run, its
setup and its writer read (pipeline/write_base.py; on a cluster, cluster/base_shards.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kldtool.codec import DEFAULT_CLAMP, Coding
from kldtool.codec.rows import GRID, LLAMA_ROUNDING
from kldtool.logitsfile.header import CONTAINER, RAW_LAYOUT
from kldtool.pipeline.hidden_base import DEFAULT_TOLERANCE
from kldtool.text.protocols import Protocol


def default_codec(fmt: str) -> str:
    """llama.cpp's own rounding for its raw layout (byte-identical files); the exact-for-bf16
    power-of-two grid for kldtool's container (see codec/rows.py)."""
    return LLAMA_ROUNDING if fmt == RAW_LAYOUT else GRID


@dataclass(kw_only=True, frozen=True)
class BaseJob:
    protocol: Protocol
    out_path: str | None = None  # None: perplexity only, no file
    chunks: int | None = None
    fmt: str = CONTAINER
    codec: str | None = None  # None: the layout's own (default_codec)
    keep: int | None = None  # --keep top-K
    clamp: float = DEFAULT_CLAMP
    frame_rows: int | None = None
    force: bool = False
    resume: bool = False
    store: str = "logprobs"  # or hidden (pipeline/hidden_base.py)
    replay_tolerance: float = DEFAULT_TOLERANCE
    head: str = "inline"
    routing: bool | None = None  # --routing, --no-routing, or None (pipeline/routing_base.py decides)

    def resolved(self) -> "BaseJob":
        return replace(self, codec=self.codec or default_codec(self.fmt))

    @property
    def coding(self) -> Coding:
        return Coding(self.codec or default_codec(self.fmt), self.clamp, self.keep)
