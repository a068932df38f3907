"""Crash safety: `base` and `compare` killed (SIGINT, SIGKILL) at a random chunk, then run
again with --resume, end exactly as an uninterrupted run: byte-identical base files, the same
printed lines, the same statistics."""

import json
import random
import signal

import numpy as np
import pytest

from conftest import WIKI, run_cli
from helpers.interrupt import run_until
from kldtool.logitsfile import container

N_CHUNKS = 12  # a pass (2 chunks) is ~2 s on 2 cores; a kill lands within a pass or two
BASE_FLAGS = ["-f", WIKI, "-c", 128, "--chunks", N_CHUNKS, "-b", 256]  # 2 chunks a pass
# The container in frames of 20 rows (4 per chunk of 63 rows): a kill may land between a
# chunk's frames, and resume must drop the chunk's frames already written.
LAYOUT = {"llamacpp": ["--format", "llamacpp"], "kldtool": ["--format", "kldtool", "--frame-rows", 20]}


@pytest.fixture(scope="module")
def uninterrupted(q4_1_gguf, tmp_path_factory):
    """Reference runs: base files in both formats and their printed lines."""
    d = tmp_path_factory.mktemp("uninterrupted")
    runs = {}
    for fmt, name in (("llamacpp", "full.kld"), ("kldtool", "full.kldt")):
        p = run_cli("base", "-m", q4_1_gguf, *BASE_FLAGS, *LAYOUT[fmt], "--kl-divergence-base", d / name)
        runs[fmt] = (d / name, p)
    return runs


def per_token_columns(path) -> dict:
    import h5py

    with h5py.File(path, "r") as f:
        return {k: f[k][:].tobytes() for k in f}


def container_parts(path):
    """(bytes before the index, index, metadata without the run's timing and resume notes)."""
    data = path.read_bytes()
    index_offset, meta_len = (int(x) for x in np.frombuffer(data[-container.TRAILER :], "<u8", 2))
    n_index = len(data) - container.TRAILER - meta_len - index_offset
    meta = json.loads(data[index_offset + n_index : len(data) - container.TRAILER])
    for k in ("created", "resumed_after_chunk", "host"):
        meta.pop(k, None)
    meta["result"].pop("wall_time_s")
    return data[:index_offset], data[index_offset : index_offset + n_index], meta


@pytest.mark.parametrize(
    "fmt, sig, seed",
    [
        # Each layout under one signal: what a signal changes (a handler's orderly stop or none)
        # does not depend on the layout, and CI's minutes go further elsewhere.
        ("llamacpp", signal.SIGKILL, 1),
        ("kldtool", signal.SIGINT, 4),
    ],
)
def test_base_resume_gives_the_same_file(uninterrupted, q4_1_gguf, tmp_path, fmt, sig, seed):
    ref_path, ref = uninterrupted[fmt]
    k = random.Random(seed).randrange(2, N_CHUNKS - 6)
    out = tmp_path / ref_path.name
    args = ["base", "-m", q4_1_gguf, *BASE_FLAGS, *LAYOUT[fmt], "--kl-divergence-base", out]
    rc, stdout, stderr = run_until(args, rf"\[{k}\]", sig)
    print(f"killed with {sig.name} after chunk {k}: rc {rc}")
    assert rc == (130 if sig == signal.SIGINT else -9), stderr
    assert not out.exists(), "an interrupted run left a file that looks complete"
    assert (tmp_path / f".{out.name}.partial").exists()
    if sig == signal.SIGINT:
        assert "Traceback" not in stderr and "--resume continues it" in stderr
    p = run_cli(*args, "--resume")
    assert "resuming" in p.stderr
    assert p.stdout == ref.stdout  # every [k]ppl, value, the recovered ones included
    final = [l for l in ref.stderr.splitlines() if l.startswith("Final estimate")]
    assert final and final[0] in p.stderr
    if fmt == "llamacpp":
        assert out.read_bytes() == ref_path.read_bytes()
    else:
        assert container_parts(out) == container_parts(ref_path)
    assert sorted(x.name for x in tmp_path.iterdir()) == [out.name]


def test_base_resume_refuses_other_settings(uninterrupted, q4_1_gguf, tmp_path):
    out = tmp_path / "b.kld"
    args = ["base", "-m", q4_1_gguf, *BASE_FLAGS, "--format", "llamacpp", "--kl-divergence-base", out]
    run_until(args, r"\[3\]", signal.SIGKILL)
    p = run_cli(*args[:-2], "--codec", "grid", "--kl-divergence-base", out, "--resume", check_rc=2)
    assert "codec: 'llamacpp' then, 'grid' now" in p.stderr.splitlines()[-1]
    p = run_cli(*args)  # without --resume: starts over, says so
    assert "replaced an interrupted" in p.stderr
    assert out.read_bytes() == uninterrupted["llamacpp"][0].read_bytes()


def compare_common(base, model) -> list:
    return ["compare", "--kl-divergence-base", base, "-m", model, "-b", 256, "--checkpoint-every", 1]


@pytest.fixture(scope="module")
def compared(uninterrupted, requant, tmp_path_factory):
    """The uninterrupted checkpointed compare both signals' runs must end as: (stdout, --json
    result, --per-token columns)."""
    d = tmp_path_factory.mktemp("compared")
    base, model = uninterrupted["llamacpp"][0], requant("Q2_K")
    files = {"--state": d / "ref.state", "--json": d / "ref.json", "--per-token": d / "ref.h5"}
    ref = run_cli(*compare_common(base, model), *(x for kv in files.items() for x in kv))
    plain = run_cli("compare", "--kl-divergence-base", base, "-m", model, "-b", 256)
    assert plain.stdout == ref.stdout  # checkpointing changes nothing
    return ref.stdout, json.loads(files["--json"].read_text()), per_token_columns(files["--per-token"])


@pytest.mark.parametrize("sig, seed", [(signal.SIGKILL, 5), (signal.SIGINT, 6)])
def test_compare_resume_gives_the_same_statistics(uninterrupted, requant, compared, tmp_path, sig, seed):
    ref_stdout, theirs, ref_columns = compared
    common = compare_common(uninterrupted["llamacpp"][0], requant("Q2_K"))
    k = random.Random(seed).randrange(2, N_CHUNKS - 6)
    args = [
        *common,
        "--state",
        tmp_path / "run.state",
        "--json",
        tmp_path / "run.json",
        "--per-token",
        tmp_path / "run.h5",
    ]
    rc, stdout, stderr = run_until(args, rf"^\s+{k} ", sig)
    print(f"killed with {sig.name} after chunk {k}: rc {rc}")
    assert rc == (130 if sig == signal.SIGINT else -9), stderr
    assert not (tmp_path / "run.json").exists() and not (tmp_path / "run.h5").exists()
    assert (tmp_path / "run.state").exists() and (tmp_path / ".run.h5.partial").exists()
    p = run_cli(*args, "--resume")
    assert "resuming" in p.stderr
    assert p.stdout == ref_stdout
    ours = json.loads((tmp_path / "run.json").read_text())
    assert ours["statistics"] == theirs["statistics"]
    assert ours["resumed_at_chunks"] and ours["resumed_at_chunks"][0] % 2 == 0
    assert per_token_columns(tmp_path / "run.h5") == ref_columns
    assert not (tmp_path / ".run.h5.partial").exists()

    again = run_cli(*args, "--resume")  # a finished state: only replays
    assert again.stdout == ref_stdout


def test_compare_resume_refuses_another_model(uninterrupted, requant, q4_1_gguf, tmp_path):
    base = uninterrupted["llamacpp"][0]
    state = tmp_path / "s.state"
    run_cli("compare", "--kl-divergence-base", base, "-m", requant("Q2_K"), "--chunks", 4, "--state", state)
    p = run_cli(
        "compare",
        "--kl-divergence-base",
        base,
        "-m",
        q4_1_gguf,
        "--chunks",
        4,
        "--state",
        state,
        "--resume",
        check_rc=8,
    )
    assert "s.state" in p.stderr and "written for model" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.quick
def test_resume_without_a_state_file_is_one_line(fixture_base, q4_1_gguf, tmp_path):
    out = tmp_path / "r.json"
    p = run_cli("compare", "--kl-divergence-base", fixture_base, "-m", q4_1_gguf, "--resume", "--json", out, check_rc=2)
    assert p.stderr.strip().splitlines() == [
        "kldtool: error: --resume needs --state FILE (the checkpoint to continue from)"
    ]
    assert not out.exists()
