"""A helibrunna training run on disk: its checkpoints and its training history (no torch here).

helibrunna (a trainer for xLSTM language models) leaves, in one run directory, the tokenizer
(``tokenizer.json``), the training log (``history.json``: lists ``loss``, ``lr``, ``epoch``,
``step``) and one folder per saved step: ``checkpoint-N/`` and, at the end, ``checkpoint-N-last/``,
each with ``config.yaml`` and ``model.safetensors``. ``-m RUN`` means the last checkpoint, as
helibrunna's own loader takes it; ``-m RUN/checkpoint-N`` one of them.
"""

from __future__ import annotations

import bisect
import fnmatch
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from kldtool.errors import EngineError, UsageError

_NAME = re.compile(r"^checkpoint-(\d+)(-last)?$")


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    last: bool

    @property
    def name(self) -> str:
        return self.path.name


def is_checkpoint(path: str | os.PathLike) -> bool:
    p = Path(path)
    return bool(_NAME.match(p.name)) and (p / "config.yaml").is_file()


def is_run(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "tokenizer.json").is_file() and any(is_checkpoint(c) for c in p.glob("checkpoint-*"))


def looks_like(path: str | os.PathLike) -> bool:
    """Whether ``-m path`` names a helibrunna run or one of its checkpoints."""
    return is_run(path) or (is_checkpoint(path) and is_run(Path(path).parent))


def checkpoints(run: Path) -> list[Checkpoint]:
    """The run's checkpoints by step (a ``-last`` after a plain one of the same step)."""
    found = []
    for c in run.iterdir():
        m = _NAME.match(c.name)
        if m and is_checkpoint(c):
            found.append(Checkpoint(int(m.group(1)), c, bool(m.group(2))))
    if not found:
        raise EngineError(f"{run}: no checkpoint-N folder with a config.yaml (not a helibrunna run)")
    return sorted(found, key=lambda c: (c.step, c.last))


def split_model(path: str) -> tuple[Path, Checkpoint]:
    """(run directory, checkpoint) for ``-m``: a run means its last checkpoint."""
    p = Path(path)
    if is_checkpoint(p):
        run = p.parent
        return run, next(c for c in checkpoints(run) if c.path.name == p.name)
    found = checkpoints(p)
    last = [c for c in found if c.last]
    return p, (last or found)[-1]


def select(run: Path, spec: str) -> list[Checkpoint]:
    """``--checkpoints``: ``all``, or comma-separated steps, ``last``, folder names and globs over
    them, in step order without repeats. A name that matches nothing is an error."""
    found = checkpoints(run)
    if spec.strip() == "all":
        return found
    chosen: list[Checkpoint] = []
    for part in (x.strip() for x in spec.split(",")):
        if not part:
            continue
        if part == "last":
            hits = [c for c in found if c.last] or found[-1:]
        elif part.isdigit():
            hits = [c for c in found if c.step == int(part)]
        else:
            hits = [c for c in found if fnmatch.fnmatchcase(c.name, part) or fnmatch.fnmatchcase(str(c.step), part)]
        if not hits:
            steps = ", ".join(c.name for c in found)
            raise UsageError(f"--checkpoints {spec}: {part!r} matches no checkpoint of {run} (it has {steps})")
        chosen += [c for c in hits if c not in chosen]
    if not chosen:
        raise UsageError(f"--checkpoints {spec!r}: names no checkpoint")
    return sorted(chosen, key=lambda c: (c.step, c.last))


@dataclass(frozen=True)
class History:
    steps: list[int]
    loss: list[float]

    @classmethod
    def read(cls, run: Path) -> "History | None":
        path = run / "history.json"
        if not path.is_file():
            return None
        try:
            h = json.loads(path.read_text())
            pairs = sorted(zip((int(s) for s in h["step"]), (float(x) for x in h["loss"])))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise EngineError(f"{path}: not a helibrunna history (lists 'step' and 'loss'): {e}") from None
        return cls([s for s, _ in pairs], [x for _, x in pairs])

    def loss_at(self, step: int) -> tuple[float, int] | None:
        """(training loss, the logged step it is from): the step itself, else the nearest logged
        one (the earlier on a tie)."""
        if not self.steps:
            return None
        i = bisect.bisect_left(self.steps, step)
        near = [j for j in (i - 1, i) if 0 <= j < len(self.steps)]
        j = min(near, key=lambda k: (abs(self.steps[k] - step), self.steps[k]))
        return self.loss[j], self.steps[j]


class Layout:
    """What a sweep over a training run's checkpoints needs of its layout (pipeline/
    checkpoint_sweep.py imports it): whether a path is a run, its checkpoints chosen by a
    spec, and its logged training loss."""

    is_run = staticmethod(is_run)
    select = staticmethod(select)
    history = staticmethod(History.read)


LAYOUT = Layout()
