"""kldtool sweep --ray and base --ray --shards on a real Ray cluster of this machine: a head and
a second node, each a process group of its own with one CPU (helpers/ray_node.py), the second in
a mount namespace that hides one directory from its workers. Four real requants of SmolLM2
through llama.cpp against llama.cpp's fixture base; every Ray result is checked against the
same command run without Ray: the same output, character for character, the same base file."""

import json
import re
import shutil
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import WIKI, run_cli

ray = pytest.importorskip("ray", reason="the Ray tests need Ray (pip install -e '.[ray]')")

HELPER = Path(__file__).parent / "helpers" / "ray_node.py"
TYPES = ("Q8_0", "Q6_K", "Q4_K_M", "Q2_K")
# Ray turns 127.0.0.1 into the machine's outward address unless this is 0: the cluster and the
# driver all stay on loopback (helpers/ray_node.py).
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
FLAGS = ("--min-chunks", "2", "-b", "256", "-t", "1")


class Node:
    def __init__(self, *args: str):
        self.p = subprocess.Popen(
            [sys.executable, str(HELPER), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its own process group: killing it takes the raylet and workers
            env=dict(os.environ, **LOOPBACK),
        )
        self.id = self.p.stdout.readline().strip()  # printed once the node is up
        assert self.id, f"ray node {args} did not start"

    def kill(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait(timeout=60)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("ray")
    hidden = d / "hidden"
    hidden.mkdir()
    head = Node("head", str(d))
    address = (d / "address").read_text()
    nodes = [head]
    try:
        nodes.append(Node("node", address, str(hidden)))
        yield {"address": address, "hidden": hidden, "second": nodes[1].id}
    finally:
        for n in reversed(nodes):
            n.kill()


@pytest.fixture(scope="module")
def models(requant):
    return [x for t in TYPES for x in ("-m", requant(t))]


def sweep(base, models, out, *extra, rc=0, ray_address=None):
    on = ("--ray", ray_address) if ray_address else ()
    args = ("sweep", "--kl-divergence-base", base, *models, "-o", out, *FLAGS, *on, *extra)
    return run_cli(*args, check_rc=rc, env_extra=LOOPBACK)


@pytest.fixture(scope="module")
def alone(fixture_base, models, tmp_path_factory):
    """The sweeps without Ray every Ray sweep must print."""
    d = tmp_path_factory.mktemp("alone")
    return {
        "default": sweep(fixture_base, models, d / "default").stdout,
        "target": sweep(fixture_base, models, d / "target", "--order", "random:7", "--target-ci", "0.3").stdout,
    }


@pytest.mark.parametrize("kind, extra", [("default", ()), ("target", ("--order", "random:7", "--target-ci", "0.3"))])
def test_a_sweep_on_ray_prints_what_one_machine_prints(cluster, fixture_base, models, alone, tmp_path, kind, extra):
    p = sweep(fixture_base, models, tmp_path / "o", *extra, ray_address=cluster["address"])
    assert p.stdout == alone[kind]
    log = json.loads((tmp_path / "o" / "sweep.json").read_text())
    turns = log["turns"]
    assert {t["quant"] for t in turns} == {f"requant-{t}" for t in TYPES}
    assert all(t["node"].startswith("127.0.0.1 (") and t["attempts"] == 1 for t in turns)
    # Both nodes played: the round's turns ran side by side.
    assert len({t["node"] for t in turns}) == 2, turns
    assert "2 nodes checked" in p.stderr


def test_a_quant_that_fails_is_reported_and_the_rest_go_on(cluster, fixture_base, requant, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(Path(requant("Q2_K")).read_bytes()[: 1 << 20])  # cut: llama.cpp cannot load it
    models = ["-m", requant("Q8_0"), "-m", bad, "-m", requant("Q2_K")]
    here = sweep(fixture_base, models, tmp_path / "here", rc=1)
    there = sweep(fixture_base, models, tmp_path / "there", rc=1, ray_address=cluster["address"])
    assert there.stdout == here.stdout
    assert (
        re.search(r"\n  broken +0 windows  failed: .*could not load", there.stdout)
        and "requant-Q2_K vs requant-Q8_0" in there.stdout
    )
    assert there.stderr.strip().splitlines()[-1] == "kldtool: error: sweep: 1 of 3 quants failed: broken (see above)"
    log = json.loads((tmp_path / "there" / "sweep.json").read_text())
    assert list(log["failed"]) == ["broken"] and str(bad) in log["failed"]["broken"]
    assert log["quants"]["broken"]["stopped"].startswith("failed: ")


def test_ray_local_starts_a_cluster_of_its_own_and_prints_the_same(fixture_base, requant, tmp_path):
    models = ["-m", requant("Q8_0"), "-m", requant("Q2_K")]
    here = sweep(fixture_base, models, tmp_path / "here")
    there = sweep(fixture_base, models, tmp_path / "there", ray_address="local")
    assert there.stdout == here.stdout
    turns = json.loads((tmp_path / "there" / "sweep.json").read_text())["turns"]
    assert all(t["node"].startswith("127.0.0.1 (") for t in turns)


def test_a_path_a_node_cannot_see_is_one_line_naming_the_node(cluster, fixture_base, requant, tmp_path):
    hidden_base = cluster["hidden"] / "base.kld"
    hidden_base.write_bytes(Path(fixture_base).read_bytes())
    p = sweep(hidden_base, ["-m", requant("Q8_0")], tmp_path / "o", rc=2, ray_address=cluster["address"])
    (line,) = p.stderr.strip().splitlines()
    assert f"({cluster['second'][:8]}) cannot see {hidden_base}" in line and "--ship-base" in line
    assert not (tmp_path / "o" / "sweep.json").exists()


def test_ship_base_reaches_a_node_that_cannot_see_it(cluster, fixture_base, models, alone, tmp_path):
    hidden_base = cluster["hidden"] / "shipped.kld"
    hidden_base.write_bytes(Path(fixture_base).read_bytes())
    out = tmp_path / "o"
    p = sweep(hidden_base, models, out, "--ship-base", ray_address=cluster["address"])
    assert p.stdout == alone["default"]
    assert "in the object store" in p.stderr
    turns = json.loads((out / "sweep.json").read_text())["turns"]
    assert any(cluster["second"][:8] in t["node"] for t in turns)  # the node that cannot see it played
    # Each node opened a copy in its own temporary directory, not the driver's file.
    opened = {json.loads((out / f"requant-{t}.json").read_text())["base_file"]["path"] for t in TYPES}
    assert str(hidden_base) not in opened and all("kldtool-shipped" in x for x in opened)
    # The head's copy (the second node's is out of sight): the full size, holding exactly the
    # original's bytes in the windows it fetched, which are the windows its turns visited.
    (copy,) = [Path(x) for x in opened if Path(x).parent.parent == Path(tempfile.gettempdir(), "kldtool-shipped")]
    try:
        fetched = json.loads(Path(str(copy) + ".windows.json").read_text())
        original, held = Path(fixture_base).read_bytes(), copy.read_bytes()
        assert len(held) == len(original) and 0 < len(fetched) <= 8
        # llama.cpp's layout: magic and 3 int32 (20 bytes), 8 x 128 int32 tokens, 8 equal chunks
        rows = len(original) - 20 - 4 * 128 * 8
        assert rows % 8 == 0
        size = rows // 8
        for w in fetched:
            start = 20 + 4 * 128 * 8 + w * size
            assert held[start : start + size] == original[start : start + size], w
    finally:
        shutil.rmtree(copy.parent)


def test_ship_base_of_a_container_prints_what_one_machine_prints(cluster, single_bases, requant, tmp_path):
    path, _ = single_bases["kldtool"]  # frames of zstd rows: each window's frames are shipped
    hidden = cluster["hidden"] / "container.kldt"
    hidden.write_bytes(path.read_bytes())
    models = ["-m", requant("Q8_0"), "-m", requant("Q2_K")]
    here = sweep(path, models, tmp_path / "here")
    try:
        there = sweep(hidden, models, tmp_path / "there", "--ship-base", ray_address=cluster["address"])
        assert there.stdout == here.stdout
    finally:
        for copy in Path(tempfile.gettempdir(), "kldtool-shipped").glob("*/container.kldt"):
            shutil.rmtree(copy.parent)


@pytest.mark.parametrize(
    "extra, words",
    [
        (("--ray-gpus-per-task", "1"), "no node of the cluster has what each task asks (CPU 1, GPU 1)"),
        (("--ray-resource", "tpu=0"), "expected NAME or NAME=AMOUNT"),
    ],
)
def test_a_task_no_node_can_hold_is_refused(cluster, fixture_base, requant, tmp_path, extra, words):
    p = sweep(fixture_base, ["-m", requant("Q8_0")], tmp_path / "o", *extra, rc=2, ray_address=cluster["address"])
    (line,) = p.stderr.strip().splitlines()
    assert words in line


def test_ray_flags_without_ray_and_an_address_nobody_answers(fixture_base, requant, tmp_path):
    p = sweep(fixture_base, ["-m", requant("Q8_0")], tmp_path / "o", "--ray-retries", "1", rc=2)
    assert "--ray-retries: only with --ray ADDRESS" in p.stderr
    p = sweep(fixture_base, ["-m", requant("Q8_0")], tmp_path / "o", rc=2, ray_address="127.0.0.1:1")
    (line,) = p.stderr.strip().splitlines()
    assert "--ray 127.0.0.1:1: nothing answers there" in line


BASE = ("base", "-f", WIKI, "-c", "128", "--chunks", "13", "-b", "512", "-t", "1")  # 4 windows a batch


@pytest.fixture(scope="module")
def single_bases(tmp_path_factory):
    """The base files (and printed lines) of one run on this machine, in both formats."""
    d = tmp_path_factory.mktemp("single")
    out = {}
    for fmt in ("llamacpp", "kldtool"):
        p = run_cli(*BASE, "--format", fmt, "--kl-divergence-base", d / f"base.{fmt}")
        out[fmt] = (d / f"base.{fmt}", p.stdout)
    return out


def test_base_in_three_shards_is_the_single_runs_file_byte_for_byte(cluster, single_bases, tmp_path):
    path, stdout = single_bases["llamacpp"]
    out = tmp_path / "sharded.kld"
    args = ("--format", "llamacpp", "--kl-divergence-base", out, "--json", tmp_path / "r.json")
    p = run_cli(*BASE, *args, "--ray", cluster["address"], "--shards", "3", env_extra=LOOPBACK)
    assert out.read_bytes() == path.read_bytes()
    assert p.stdout == stdout  # the same PPL line, window by window
    assert "3 shards on the Ray cluster: 1..4, 5..8, 9..13" in p.stderr
    shards = json.loads((tmp_path / "r.json").read_text())["shards"]
    assert [s["windows"] for s in shards] == [[0, 4], [4, 8], [8, 13]]
    assert sorted(tmp_path.iterdir()) == [tmp_path / "r.json", out]  # no part file left


def test_a_sharded_container_differs_from_the_single_one_only_in_its_time(cluster, single_bases, tmp_path):
    from kldtool.logitsfile import open_base_file

    path, stdout = single_bases["kldtool"]
    out = tmp_path / "sharded.kldt"
    p = run_cli(*BASE, "--kl-divergence-base", out, "--ray", cluster["address"], "--shards", "2", env_extra=LOOPBACK)
    assert p.stdout == stdout
    a, b = open_base_file(path), open_base_file(out)
    try:
        assert a.header == b.header and np.array_equal(a.tokens, b.tokens)
        for i in range(a.header.n_chunk):
            assert np.array_equal(a.read_chunk(i), b.read_chunk(i)), i
        ma, mb = dict(a.metadata), dict(b.metadata)
        assert ma.pop("created") and mb.pop("created")
        assert ma.pop("result").pop("wall_time_s") and mb.pop("result").pop("wall_time_s")
        assert ma == mb
    finally:
        a.close()
        b.close()


def test_two_drivers_of_one_output_never_mix_their_shards(cluster, single_bases, tmp_path):
    """Issue 78: two `base --ray --shards 2` started at once on the same output. Each run's parts
    carry its own id and plan, so each driver either finishes with the single run's bytes or
    stops with a one-line error (the output is written by one of them at a time); never a mixed
    file, and no part of either is left behind."""
    path, _ = single_bases["llamacpp"]
    out = tmp_path / "both.kld"
    args = [*map(str, BASE), "--format", "llamacpp", "--kl-divergence-base", str(out)]
    drivers = [
        subprocess.Popen(
            [sys.executable, "-m", "kldtool", *args, "--ray", cluster["address"], "--shards", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, **LOOPBACK),
        )  # fmt: skip
        for _ in range(2)
    ]
    ends = [(d.wait(timeout=600), d.stderr.read()) for d in drivers]
    finished = [rc for rc, _ in ends if rc == 0]
    for rc, err in ends:
        if rc:
            lines = [x for x in err.strip().splitlines() if x.startswith("kldtool: error:")]
            assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert finished, ends
    assert out.read_bytes() == path.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["both.kld"]  # no part, temporary or partial left


@pytest.mark.quick
def test_a_part_of_another_plan_is_refused_in_one_line(tmp_path):
    from kldtool.cluster.base_shards import PartBlocks, _part_record
    from kldtool.errors import EngineError

    part = tmp_path / ".b.kld.abc-1.shard-1-of-1"
    with open(part, "wb") as f:
        np.lib.format.write_array(f, _part_record("1" * 64, 0, 4), allow_pickle=False)
    with pytest.raises(EngineError) as e:
        PartBlocks([str(part)], 4, "2" * 64, [(0, 4)])
    assert "holds windows [0, 4] of plan 111111111111, this run expects [0, 4] of plan 222222222222" in str(e.value)
    with pytest.raises(EngineError, match="of plan 111111111111, this run expects \\[0, 8\\]"):
        PartBlocks([str(part)], 4, "1" * 64, [(0, 8)])


@pytest.mark.parametrize(
    "extra, words",
    [
        (("--shards", "2"), "--shards: only with --ray ADDRESS"),
        (("--ray", "ADDRESS"), "base --ray needs --kl-divergence-base FILE and --shards N"),
        (("--ray", "ADDRESS", "--shards", "2", "--store", "hidden"), "run on one machine only"),
    ],
)
def test_bad_sharded_base_flags_are_one_line_usage_errors(cluster, tmp_path, extra, words):
    extra = tuple(cluster["address"] if x == "ADDRESS" else x for x in extra)
    out = () if "needs" in words else ("--kl-divergence-base", tmp_path / "b.kldt")
    p = run_cli(*BASE, *out, *extra, check_rc=2, env_extra=LOOPBACK)
    (line,) = p.stderr.strip().splitlines()
    assert words in line


def _windows(state: Path) -> list[int]:
    with np.load(state) as z:
        return [int(i) for i in z["chunks"]]


def _driver(base, models, out, address) -> subprocess.Popen:
    args = ["sweep", "--kl-divergence-base", str(base), *map(str, models), "-o", str(out), *FLAGS, "--ray", address]
    return subprocess.Popen(
        [sys.executable, "-m", "kldtool", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, **LOOPBACK),
        start_new_session=True,
    )


def _until(what, seconds=180.0):
    t = time.time()
    while not what():
        assert time.time() - t < seconds, "timed out waiting"
        time.sleep(0.02)


def test_a_driver_killed_half_way_resumes_and_scores_nothing_twice(cluster, fixture_base, models, alone, tmp_path):
    out = tmp_path / "o"
    log = out / "sweep.json"
    p = _driver(fixture_base, models, out, cluster["address"])

    def second_round_running():
        rounds = json.loads(log.read_text())["rounds"] if log.exists() else []
        return len(rounds) >= 2 and any((out / f"requant-{t}.turns").read_text().count('"round": 4') for t in TYPES)

    _until(second_round_running)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    again = sweep(fixture_base, models, out, ray_address=cluster["address"])
    assert again.stdout == alone["default"]
    # Each quant's state holds every window it scored once, in the one visiting order.
    for t in TYPES:
        seen = _windows(out / f"requant-{t}.state.npz")
        assert len(seen) == len(set(seen)), (t, seen)
        result = json.loads((out / f"requant-{t}.json").read_text())
        assert result["windows_scored"] == len(seen)


def test_a_node_killed_while_its_task_runs_costs_nothing(cluster, fixture_base, models, alone, tmp_path):
    extra = Node("node", cluster["address"])  # the node this test takes down
    try:
        out = tmp_path / "o"
        p = _driver(fixture_base, models, out, cluster["address"])

        def on_the_doomed_node():
            return any(
                extra.id[:8] in (out / f"requant-{t}.turns").read_text()
                for t in TYPES
                if (out / f"requant-{t}.turns").exists()
            )

        _until(on_the_doomed_node)
        extra.kill()
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        assert stdout == alone["default"]
        turns = json.loads((out / "sweep.json").read_text())["turns"]
        retried = [t for t in turns if t["attempts"] > 1]
        assert retried and all(extra.id[:8] not in t["node"] for t in retried), turns
    finally:
        extra.kill()
