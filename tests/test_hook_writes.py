"""The served hook writes only where it checked (issue 78): a client holding the operator's
token races it between a request's admission and its result, and nothing outside the exchange
root changes.

The hook here is the real one (engines/vllm/worker.py's WorkerState under a served policy),
driven as vLLM's runner drives it: a window scored over two steps. Between them, the test
does what a hostile client can: plant symlinks at every name the hook could use (its old
``.KEY.kind.partial-PID`` and the final ``KEY.kind``) and swap the checked directory for a
symlink to a directory outside. The result's NLL is checked against float64 numpy on the
same logits: it lands, whole, in the directory that was checked.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from kldtool.engines.vllm import wire
from kldtool.engines.vllm.confined import ExchangeDir, NotConfined
from kldtool.engines.vllm.policy import Policy, Refused
from kldtool.engines.vllm.worker import WorkerState

pytestmark = pytest.mark.quick

N_VOCAB, N_SCORED = 64, 16
KEY = "0123456789ab-7"
KINDS = ("npz", "err", "json")


class Box:
    """An exchange root with the client's directory in it, a directory outside it, and a
    sentinel file outside it that every planted link points at."""

    def __init__(self, tmp: Path):
        self.root, self.outside, self.bases = tmp / "exchange", tmp / "outside", tmp / "bases"
        for d in (self.root, self.outside, self.bases):
            d.mkdir()
        self.run = self.root / "run"
        self.run.mkdir()
        self.sentinel = self.outside / "sentinel"
        self.sentinel.write_bytes(b"the operator's file\n")
        self.before = self._outside_state()

    def _outside_state(self) -> dict:
        return {p.name: (p.is_symlink(), p.read_bytes() if p.is_file() else None) for p in self.outside.iterdir()}

    def plant_links(self, directory: Path) -> list[Path]:
        """Symlinks to the sentinel at every name the hook could write under ``directory``."""
        names = [f"{KEY}.{k}" for k in KINDS] + [f".{KEY}.{k}.partial-{os.getpid()}" for k in KINDS]
        for n in names:
            (directory / n).symlink_to(self.sentinel)
        return [directory / n for n in names]

    def swap_for_link(self) -> Path:
        """The checked directory moved away and a symlink to ``outside`` put in its place."""
        moved = self.root / "run.moved"
        os.rename(self.run, moved)
        self.run.symlink_to(self.outside, target_is_directory=True)
        return moved

    def outside_unchanged(self) -> bool:
        return self._outside_state() == self.before and self.sentinel.read_bytes() == b"the operator's file\n"


def _hook(box: Box) -> WorkerState:
    policy = Policy(served=True, base_roots=(str(box.bases.resolve()),), exchange_root=str(box.root.resolve()))
    return WorkerState({"n_vocab": N_VOCAB, "hidden_size": 8, "dtype": "float32"}, policy, rank=0)


def _spec(out: Path) -> str:
    spec = {"v": wire.VERSION, "key": KEY, "mode": "nll", "first": 0, "n_scored": N_SCORED, "chunk": 0,
            "after": 5, "logits_block": 4, "out": str(out)}  # fmt: skip
    return json.dumps(spec)


def _scored_in_two_steps(box: Box, between) -> tuple[np.ndarray, np.ndarray]:
    """One nll request scored over two steps, ``between()`` run after the first (admission and
    half the window) and before the second (the rest, then the result is written). Returns the
    logits the hook saw and the prompt's targets."""
    hook = _hook(box)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, N_VOCAB, N_SCORED)]
    logits = torch.randn(N_SCORED, N_VOCAB, generator=torch.Generator().manual_seed(1))
    half = N_SCORED // 2
    hook.step("req-1", _spec(box.run), prompt, 0, half, lambda a, b: logits[a:b], None)
    assert hook.requests["req-1"].where is not None and not hook.requests["req-1"].done
    between()
    hook.step("req-1", _spec(box.run), prompt, half, N_SCORED - half, lambda a, b: logits[a:b], None)
    assert hook.requests["req-1"].done and hook.requests["req-1"].where is None  # its descriptor closed
    return logits.double().numpy(), np.array(prompt[1:] + [5])


def _nll_float64(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    m = logits.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
    return lse - logits[np.arange(len(targets)), targets]


def _result(directory: Path) -> np.ndarray:
    path = directory / f"{KEY}.npz"
    assert path.is_file() and not path.is_symlink(), sorted(os.listdir(directory))
    with np.load(io.BytesIO(path.read_bytes())) as z:
        return z["nll"]


def test_links_planted_at_every_name_are_replaced_never_written_through(tmp_path):
    box = Box(tmp_path)
    logits, targets = _scored_in_two_steps(box, lambda: box.plant_links(box.run))
    assert box.outside_unchanged()
    np.testing.assert_allclose(_result(box.run), _nll_float64(logits, targets), rtol=1e-5, atol=1e-6)
    assert not [n for n in os.listdir(box.run) if n.endswith(".partial") and not os.path.islink(box.run / n)]


def test_the_checked_directory_swapped_for_a_link_still_receives_the_result(tmp_path):
    box = Box(tmp_path)
    moved: list[Path] = []

    def attack():
        moved.append(box.swap_for_link())
        box.plant_links(box.outside)  # and links in the directory the swapped link leads to
        box.before = box._outside_state()

    logits, targets = _scored_in_two_steps(box, attack)
    assert box.outside_unchanged(), sorted(os.listdir(box.outside))
    np.testing.assert_allclose(_result(moved[0]), _nll_float64(logits, targets), rtol=1e-5, atol=1e-6)


def test_a_component_that_is_a_symlink_is_never_followed(tmp_path):
    """The walk from the root's descriptor: a directory made a symlink between the real-path
    check and the walk (here: before the walk, on a resolved path computed earlier) fails."""
    box = Box(tmp_path)
    root = str(box.root.resolve())
    resolved = str(box.run.resolve())
    box.swap_for_link()
    with pytest.raises(NotConfined, match="run is not a directory"):
        ExchangeDir.below(root, resolved, "run")
    with pytest.raises(NotConfined, match="outside"):
        ExchangeDir.below(root, str(box.outside.resolve()), "outside")
    # the policy's whole check: a link out of the root is refused by its real path
    with pytest.raises(Refused, match="outside KLDTOOL_VLLM_EXCHANGE_ROOT"):
        _hook(box).policy.exchange_dir(str(box.run))


def test_publish_is_whole_or_absent(tmp_path):
    """A directory planted at the result's name: the rename fails, the partial is removed and the
    error names no file's bytes; the descriptor still writes other results."""
    box = Box(tmp_path)
    d = ExchangeDir.below(str(box.root.resolve()), str(box.run.resolve()), "run")
    try:
        (box.run / f"{KEY}.npz").mkdir()
        with pytest.raises(OSError):
            d.publish(f"{KEY}.npz", b"x" * 100)
        d.publish(f"{KEY}.err", b"one line")
    finally:
        d.close()
    assert sorted(os.listdir(box.run)) == [f"{KEY}.err", f"{KEY}.npz"]
    assert (box.run / f"{KEY}.err").read_bytes() == b"one line"
