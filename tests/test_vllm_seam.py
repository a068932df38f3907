"""kldtool's hook in vLLM's runner-v2 (the CUDA default) against vLLM's real
PromptLogprobsWorker and InputBatch on CPU tensors (tests/helpers/v2_seam_probe.py says how
and what the scenario is), and the tensor-parallel rank without a silent default."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def probe():
    p = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "helpers" / "v2_seam_probe.py")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_v2_hook_scores_every_position_once(probe):
    """A prefilled over three steps then decoding, C resumed after preemption (its prompt not
    scored again), E opted in beside vLLM's own prompt logprobs: kldtool's worker saw every
    scored position exactly once (it reports an error otherwise), with the right NLL."""
    assert probe["kind"] == "v2" and probe["rank"] == 0
    for r in ("A", "C", "E"):
        got = probe["results"][r]
        assert "nll" in got, got
        assert np.allclose(got["nll"], probe["reference"][r], rtol=1e-5, atol=1e-5)


def test_v2_hook_leaves_vllms_prompt_logprobs_unchanged(probe):
    plain, hooked = probe["outputs"]["plain"], probe["outputs"]["hooked"]
    assert sorted(plain) == ["B", "E"] and plain == hooked
    for r, width in (("B", 1), ("E", 4)):
        ((ids, logprobs, ranks),) = plain[r]
        ref = -np.array(probe["reference"][r])  # the target's logprob is column 0
        assert np.array(ids).shape == (len(ref), width)
        assert np.allclose(np.array(logprobs)[:, 0], ref, rtol=1e-5, atol=1e-5)


def test_rank_is_never_guessed():
    """Outside an initialised vLLM worker the rank is unknown: an error, not rank 0."""
    code = (
        "from kldtool.engines.vllm.seam import HookUnavailable, tp_rank\n"
        "try:\n    tp_rank()\nexcept HookUnavailable as e:\n    print('refused:', e)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "refused:" in p.stdout and "not initialized" in p.stdout


def _seam_check(*args):
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "vllm_seam_check.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.quick
def test_seam_check_reads_a_release_and_names_what_changed(tmp_path):
    import shutil

    import vllm

    from kldtool.engines.vllm.seam import SEAM

    p = _seam_check()
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"{len(SEAM)} of {len(SEAM)} seam items present" in p.stdout
    # The same release with one method's parameters changed, as a future vLLM might.
    installed = Path(vllm.__file__).parent
    copy = tmp_path / "vllm"
    for path in {s[0] for s in SEAM} | {"vllm/_version.py"}:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(installed.parent / path, tmp_path / path)
    f = copy / "v1/worker/gpu/sample/prompt_logprob.py"
    f.write_text(
        f.read_text().replace("def remove_request(self, req_id: str)", "def remove_request(self, req_idx: int)")
    )
    p = _seam_check(copy)
    assert p.returncode == 1
    bad = [l for l in p.stdout.splitlines() if "MISSING" in l]
    assert len(bad) == 1 and "remove_request(self, req_idx): expected (self, req_id)" in bad[0]
