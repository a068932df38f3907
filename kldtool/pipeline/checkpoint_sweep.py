"""``kldtool ppl -m RUN --checkpoints SPEC -o DIR``: one perplexity run per checkpoint of a
training run (a helibrunna run: the xlstm engine's layout), in step order, each beside
the training loss logged at its step.

Every checkpoint's result is written to ``DIR/<checkpoint>.json`` as soon as it is done, with
a key of the corpus's bytes and the scoring flags. A rerun keeps each result whose key
matches and scores only the rest, so an interrupted sweep resumes where it stopped; a result
with another key (another corpus, other lengths) is scored again and replaced.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

from kldtool.errors import OutputError, UsageError
from kldtool.pipeline.sinks import Sinks
from kldtool.runtime.small_files import read_json, write_json


def sweep_key(corpus_path: str | None, protocol: dict, chunks: int | None) -> dict:
    """What a kept result must have been scored on: the corpus file's bytes and the flags."""
    digest = None
    if corpus_path is not None and os.path.isfile(corpus_path):
        h = hashlib.sha256()
        with open(corpus_path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest = h.hexdigest()
    return {"corpus": corpus_path, "corpus_sha256": digest, "protocol": protocol, "chunks": chunks}


def checkpoint_record(c, history) -> dict:
    """A checkpoint (name, step, last) beside the training loss logged nearest its step."""
    out = {"name": c.name, "step": c.step, "last": c.last, "training_loss": None, "loss_step": None}
    found = history.loss_at(c.step) if history else None
    if found:
        out["training_loss"], out["loss_step"] = found
    return out


def run_checkpoints(
    run_dir: str,
    spec: str,
    out_dir: str,
    key: dict,
    evaluate: Callable[[object], dict],  # a checkpoint -> its result
    sinks: Sinks | None = None,
) -> list[dict]:
    sinks = sinks or Sinks()
    run = Path(run_dir)
    from kldtool.engines.xlstm.helibrunna import LAYOUT as layout

    if not layout.is_run(run):
        raise UsageError(f"--checkpoints: -m {run_dir} is not a helibrunna run (tokenizer.json, checkpoint-N/)")
    chosen = layout.select(run, spec)
    history = layout.history(run)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{out_dir}: cannot make the results directory ({e.strerror})") from None
    sinks.info(f"checkpoints: {', '.join(c.name for c in chosen)} of {run}; results in {out_dir}")
    results = []
    for c in chosen:
        path = os.path.join(out_dir, f"{c.name}.json")
        if os.path.isfile(path):
            kept = read_json(path, path)
            if isinstance(kept, dict) and kept.get("sweep_key") == key:
                sinks.info(f"{c.name}: scored before, kept ({path})")
                results.append(kept)
                continue
        sinks.info(f"{c.name}: step {c.step}")
        result = evaluate(c) | {"checkpoint": checkpoint_record(c, history), "sweep_key": key}
        write_json(path, result)
        results.append(result)
    return results
