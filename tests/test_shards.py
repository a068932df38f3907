"""Shards: `compare --chunk-range` pieces of the fixture, combined by `kldtool merge`, print
exactly what one run over all chunks prints, and what llama-perplexity printed."""

import json

import numpy as np
import pytest

from conftest import llamacpp_reference, assert_lines_match, chunk_table_lines, final_block_lines, run_cli

pytestmark = pytest.mark.quick

RANGES = ["3:6", "0:3", "6:8"]  # deliberately out of order: merge sorts them


@pytest.fixture(scope="module")
def shards(requant, fixture_base, tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    model = requant("Q2_K")
    states = []
    for r in RANGES:
        state = d / f"shard-{r.replace(':', '-')}.state"
        p = run_cli("compare", "--kl-divergence-base", fixture_base, "-m", model, "--chunk-range", r, "--state", state)
        assert len(chunk_table_lines(p.stdout)) == int(r.split(":")[1]) - int(r.split(":")[0])
        states.append(state)
    single = run_cli("compare", "--kl-divergence-base", fixture_base, "-m", model, "--json", d / "single.json")
    return d, states, single


@pytest.mark.full_tier
def test_merge_of_three_shards_prints_every_line_of_one_run(shards):
    d, states, single = shards
    merged = run_cli("merge", *states, "--json", d / "merged.json")
    assert merged.stdout == single.stdout  # the chunk table and every block, character for character
    ours, theirs = (json.loads((d / n).read_text()) for n in ("merged.json", "single.json"))
    assert ours["statistics"] == theirs["statistics"]
    assert ours["chunk_ranges"] == [[0, 3], [3, 6], [6, 8]]
    fixture = llamacpp_reference("compare-Q2_K.txt").read_text()
    assert_lines_match(chunk_table_lines(merged.stdout), chunk_table_lines(fixture))
    assert_lines_match(final_block_lines(merged.stdout), final_block_lines(fixture))


@pytest.mark.full_tier
def test_merge_refuses_overlapping_shards(shards, requant, fixture_base, tmp_path):
    _, states, _ = shards
    extra = tmp_path / "overlap.state"
    run_cli(
        "compare", "--kl-divergence-base", fixture_base, "-m", requant("Q2_K"), "--chunk-range", "2:4", "--state", extra
    )
    p = run_cli("merge", *states, extra, check_rc=8)
    (line,) = p.stderr.strip().splitlines()
    assert "overlap" in line and "2:4" in line and "Traceback" not in p.stderr


@pytest.mark.full_tier
def test_merge_notes_a_gap_and_counts_only_present_chunks(shards, tmp_path):
    d, states, _ = shards
    p = run_cli("merge", states[1], states[2], "--json", tmp_path / "gap.json")  # 0:3 and 6:8
    assert "chunks 3:6 are in no shard" in p.stderr
    assert json.loads((tmp_path / "gap.json").read_text())["statistics"]["count"] == 5 * 63


@pytest.mark.full_tier
def test_merge_refuses_an_unfinished_shard(shards, tmp_path):
    from kldtool.analysis.state_file import load_state, save_state

    _, states, _ = shards
    state = load_state(states[0])  # 3:6
    state.acc.truncate(1)  # what a shard interrupted after its first chunk leaves
    half = tmp_path / "half.state"
    save_state(half, state)
    p = run_cli("merge", half, states[1], check_rc=8)
    (line,) = p.stderr.strip().splitlines()
    assert "half.state" in line and "unfinished (holds chunks 3:4)" in line and "--resume" in line


@pytest.mark.full_tier
def test_merge_refuses_shards_of_another_base(shards, requant, fixture_base_bos, tmp_path):
    _, states, _ = shards
    other = tmp_path / "other.state"
    run_cli(
        "compare",
        "--kl-divergence-base",
        fixture_base_bos,
        "-m",
        requant("Q2_K"),
        "--chunk-range",
        "6:8",
        "--state",
        other,
        "--force",
    )
    p = run_cli("merge", states[0], states[1], other, check_rc=8)
    assert "another base file" in p.stderr and "other.state" in p.stderr


def test_merge_refuses_a_file_that_is_not_a_state(tmp_path):
    junk = tmp_path / "junk.state"
    junk.write_bytes(b"not a state file")
    p = run_cli("merge", junk, check_rc=8)
    (line,) = p.stderr.strip().splitlines()
    assert "junk.state" in line


def _rewritten(state, out, meta_change, order=None):
    """``state`` written again to ``out`` as another kldtool would have written it: its meta
    changed by ``meta_change``, its chunk sums' columns in ``order`` (names) if given."""
    with np.load(state) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["meta"].tobytes())
    names = meta["sums"]
    if order is not None:
        arrays["chunk_vectors"] = arrays["chunk_vectors"][:, [names.index(n) for n in order] + [-2, -1]]
        meta["sums"] = list(order)
    meta = meta_change(meta)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    with open(out, "wb") as f:  # a file object: savez adds no .npz
        np.savez(f, **arrays)
    return out


@pytest.mark.full_tier
def test_a_state_file_is_read_by_the_names_of_its_sums(shards, tmp_path):
    """The chunk sums are taken by the names the file lists, in whatever order; a file of a
    kldtool before the names (version 3: the sums of its time, before the confidence shift's)
    is refused, naming the sums it lacks."""
    from kldtool.analysis.state_file import SUMS_OF_VERSION

    d, states, _ = shards
    want = run_cli("merge", *states).stdout
    names = json.loads(np.load(states[0])["meta"].tobytes())["sums"]
    shuffled = _rewritten(states[0], tmp_path / "shuffled.state", lambda m: m, order=names[::-1])
    assert run_cli("merge", shuffled, *states[1:]).stdout == want
    then = [n for n in names if n in SUMS_OF_VERSION[3]]
    old = _rewritten(states[0], tmp_path / "old.state", lambda m: {**m, "version": 3, "sums": None}, order=then)
    (line,) = run_cli("merge", old, *states[1:], check_rc=8).stderr.strip().splitlines()
    assert "old.state" in line and "lack ptop_base, ptop_q, dptop2" in line
