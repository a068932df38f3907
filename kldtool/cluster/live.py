"""The driver's view of a round while its turns run on the cluster: per quant, the windows its
state file holds, its mean KLD so far with its ±, and the node it runs on. Read from the files
the tasks write (state, ``.turns``), so it costs the workers nothing.

On a terminal a live table that redraws; written to a file or pipe, a line per quant whose
windows moved, at most every few seconds (``--progress``, as for every run)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from kldtool.analysis.state_file import load_state
from kldtool.cluster.ray_task import attempts
from kldtool.errors import KldError
from kldtool.pipeline.sweep_play import Quant
from kldtool.runtime.progress import line_seconds, mode
from kldtool.stats import summarize


@dataclass(kw_only=True, frozen=True)
class Row:
    label: str
    windows: int
    look: int
    kld: tuple[float, float] | None
    node: str
    tries: int

    def text(self) -> str:
        kld = f"mean KLD {self.kld[0]:.6f} ± {self.kld[1]:.6f}" if self.kld else "no windows yet"
        tried = f", attempt {self.tries}" if self.tries > 1 else ""
        where = f"on {self.node}" if self.node else "waiting for a node"
        return f"sweep: {self.label}: {self.windows} of {self.look} windows, {kld}, {where}{tried}"


def read_row(q: Quant, look: int) -> Row:
    windows, kld = 0, None
    try:
        if os.path.exists(q.state):
            acc = load_state(q.state).acc
            windows = len(acc.chunks)
            kld = summarize(acc, with_quantiles=False).kld_mean if acc.count else None
    except (KldError, OSError):
        pass  # a state file being replaced: the next look reads it
    tried = attempts(q, look)
    return Row(
        label=q.label, windows=windows, look=look, kld=kld, node=tried[-1]["node"] if tried else "", tries=len(tried)
    )


class Board:
    def __init__(self, quants: list[Quant], look: int):
        self.quants, self.look, self.mode = quants, look, mode()
        self.every = 1.0 if self.mode == "bar" else line_seconds()
        self._shown: dict[str, Row] = {}
        self._last = 0.0
        self._live = None

    def __enter__(self) -> Board:
        if self.mode == "bar":
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=Console(file=sys.stderr), refresh_per_second=2, transient=True)
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()

    def tick(self, running: set[str]) -> None:
        """Redraw (or print what moved) when it is time; ``running``: the labels not yet back."""
        if self.mode == "none" or time.monotonic() - self._last < self.every:
            return
        self._last = time.monotonic()
        rows = [read_row(q, self.look) for q in self.quants if q.label in running]
        if self._live is not None:
            self._live.update(self._table(rows))
            return
        for r in rows:
            if self._shown.get(r.label) != r:
                print(r.text(), file=sys.stderr, flush=True)
                self._shown[r.label] = r

    def _table(self, rows: list[Row]):
        from rich.table import Table

        t = Table(title=f"sweep: round to {self.look} windows", title_justify="left")
        for name in ("quant", "windows", "mean KLD", "±", "node", "attempt"):
            t.add_column(name)
        for r in rows:
            kld = (f"{r.kld[0]:.6f}", f"{r.kld[1]:.6f}") if r.kld else ("", "")
            t.add_row(r.label, f"{r.windows}/{r.look}", *kld, r.node or "waiting", str(max(r.tries, 1)))
        return t
