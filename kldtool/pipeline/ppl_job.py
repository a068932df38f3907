"""A ppl run as the command's flags ask for it: one frozen value the CLI builds and
pipeline/ppl.py's run reads."""

from __future__ import annotations

from dataclasses import dataclass

from kldtool.text.protocols import Protocol


@dataclass(frozen=True)
class PplJob:
    protocol: Protocol
    chunks: int | None = None  # at most this many windows
    force: bool = False  # --force: windows longer than the model's trained context
