"""compare's own flags that need more than typer's parsing: the checkpoints and the order and
stopping rule (what is checked against the base file is the run's: pipeline/file_flags.py)."""

from __future__ import annotations

from kldtool.errors import UsageError


def checkpoints_of(path: str | None, every: str | None, resume: bool):
    """``--state``, ``--checkpoint-every`` and ``--resume`` as a run's Checkpoints."""
    from kldtool.pipeline.checkpoints import Checkpoints

    if resume and not path:
        raise UsageError("--resume needs --state FILE (the checkpoint to continue from)")
    if every is not None and not path:
        raise UsageError("--checkpoint-every needs --state FILE")
    spec = (every or "60s").strip()
    try:
        value = float(spec[:-1]) if spec.endswith("s") else int(spec)
    except ValueError:
        value = 0
    if value <= 0:
        raise UsageError(f"--checkpoint-every {every}: expected a number of chunks (10) or seconds (60s)")
    if spec.endswith("s"):
        return Checkpoints(path, None, value, resume)
    return Checkpoints(path, int(value), float("inf"), resume)


def stopping_of(order: str | None, target_ci: float | None, min_chunks: int):
    """``--order``, ``--target-ci`` and ``--min-chunks`` as the run's window order and stopping rule."""
    from kldtool.pipeline.early_stop import Stopping
    from kldtool.text.window_order import parse_order

    visit = parse_order(order)
    if target_ci is not None and not visit.random:
        raise UsageError(
            f"--target-ci {target_ci}: needs --order random[:SEED]; a run stopped early in the file's order "
            "has measured only the corpus's beginning"
        )
    return visit, Stopping(target_ci, min_chunks)
