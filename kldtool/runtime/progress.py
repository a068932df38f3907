"""How far a long run has come, on stderr, in the form the reader there can use.

On a terminal, one live rich bar per stage with its rate and time left; written to a file or a
pipe, a plain line at most every few seconds and one when the stage ends, so a log holds no
carriage returns and no redraws. ``--progress`` (or KLDTOOL_PROGRESS) chooses: ``auto`` (the
default: a bar where stderr is a terminal, lines otherwise), ``bar``, ``lines`` or ``none``.
Results never go through here: the llama.cpp-layout text stays on stdout, unchanged."""

from __future__ import annotations

import os
import sys
import time

from kldtool.errors import UsageError

MODES = ("auto", "bar", "lines", "none")
ENV = "KLDTOOL_PROGRESS"


def line_seconds() -> float:
    """A line at most this often when stderr is a file: enough to see a run move, few enough to
    read (KLDTOOL_PROGRESS_SECONDS; 0 writes one for every item)."""
    return float(os.environ.get("KLDTOOL_PROGRESS_SECONDS") or 10)


_chosen: str | None = None


def _checked(value: str, flag: bool) -> str:
    if value not in MODES:
        where = f"--progress {value!r}" if flag else f"{ENV}={value!r}"
        raise UsageError(f"{where}: expected one of {', '.join(MODES)}")
    return value


def choose(flag: str | None) -> None:
    """Set this process's mode from the --progress flag, else KLDTOOL_PROGRESS, checking either
    before the run starts."""
    global _chosen
    _chosen = _checked(flag, True) if flag is not None else _checked(os.environ.get(ENV) or "auto", False)


def mode() -> str:
    """The mode in force, ``auto`` resolved against this process's stderr."""
    chosen = _chosen or _checked(os.environ.get(ENV) or "auto", False)
    if chosen == "auto":
        return "bar" if _is_terminal(sys.stderr) else "lines"
    return chosen


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def quiet_third_party() -> None:
    """Keep other libraries' bars (tqdm's, the Hugging Face hub's) out of kldtool's stderr: they
    redraw with carriage returns and would interleave with ours. tqdm reads TQDM_DISABLE when it
    is imported, so this runs before any engine is."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """One stage of a run: ``what`` (say "compare"), ``total`` items of ``unit``. Use as a
    context manager; ``advance()`` per item done (with the tokens it scored, for a tokens/s
    rate), or ``to(done, total)`` from a callback."""

    def __init__(self, what: str, total: int, unit: str = "windows"):
        self.what, self.total, self.unit = what, max(int(total), 0), unit
        self.done = self.tokens = 0
        self.mode = mode()
        self._t0 = self._shown = time.monotonic()
        self._every, self._lines = line_seconds(), 0
        self._bar = self._task = None

    def __enter__(self) -> Progress:
        if self.mode == "bar" and self.total:
            self._start_bar()
        return self

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as Bar

        self._bar = Bar(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(self.unit),
            TaskProgressColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(file=sys.stderr),
            # Results printed to a terminal go above the bar; printed to a file they must not
            # be sent to stderr's console instead.
            redirect_stdout=_is_terminal(sys.stdout),
            redirect_stderr=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(self.what, total=self.total, rate="")

    def __exit__(self, kind, value, tb) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self.mode == "lines" and kind is None and self.done and (self._lines or self._elapsed() >= self._every):
            self._line(final=True)  # a stage too short for a line of its own gets none at its end either

    def advance(self, n: int = 1, tokens: int = 0) -> None:
        self.tokens += tokens
        self.to(self.done + n)

    def to(self, done: int, total: int | None = None) -> None:
        self.done = done
        if total is not None:
            self.total = total
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=self.total, rate=self._rate_text())
        elif self.mode == "lines" and done < self.total and time.monotonic() - self._shown >= self._every:
            self._line(final=False)

    def _elapsed(self) -> float:
        return time.monotonic() - self._t0

    def _rate(self) -> float:
        elapsed = self._elapsed()
        return self.done / elapsed if elapsed > 0 else 0.0

    def _rate_text(self) -> str:
        rate = self._rate()
        if not rate:
            return ""
        text = f"{rate:.2f} {self.unit}/s" if rate >= 1 else f"{1 / rate:.1f} s each"
        return text + (f", {self.tokens / self._elapsed():.0f} tokens/s" if self.tokens else "")

    def _line(self, final: bool) -> None:
        self._shown, self._lines = time.monotonic(), self._lines + 1
        elapsed = self._shown - self._t0
        head = f"{self.what}: {self.done}/{self.total} {self.unit}"
        if final:
            text = f"{head} in {_duration(elapsed)}"
        else:
            rate = self._rate()
            eta = _duration((self.total - self.done) / rate) if rate else "?"
            text = f"{head} ({100 * self.done / self.total:.0f} %), {self._rate_text()}, ETA {eta}"
        print(text, file=sys.stderr, flush=True)
