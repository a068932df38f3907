"""compare on llama.cpp in several contexts side by side (pipeline/lanes.py): the same printed
lines as llama-perplexity and as one context, whatever batch falls on which context; a lane's
error ends the run in one line like any other."""

import numpy as np
import pytest

from conftest import FIXTURES, WIKI, assert_lines_match, chunk_table_lines, final_block_lines, run_cli
from kldtool import errors
from test_cli_errors import container_tail, fail, one_line_error, small_container, small_raw  # noqa: F401


@pytest.mark.parametrize("batch", [256, 384])
def test_two_contexts_print_llama_perplexitys_lines(requant, fixture_base, batch):
    """-b 256: four batches of two chunks, two on each context. -b 384: batches of 3, 3 and 2
    chunks; the third runs once both contexts are done, on one of them with both threads."""
    model = requant("Q2_K")
    args = ("compare", "--kl-divergence-base", fixture_base, "-m", model, "-b", batch, "-t", 2)
    two = run_cli(*args, "--contexts", 2)
    one = run_cli(*args, "--contexts", 1)
    assert "2 lanes side by side" in two.stderr and "lanes" not in one.stderr
    assert two.stdout == one.stdout
    theirs = (FIXTURES / "compare-Q2_K.txt").read_text()
    assert_lines_match(chunk_table_lines(two.stdout), chunk_table_lines(theirs))
    assert_lines_match(final_block_lines(two.stdout), final_block_lines(theirs))


def test_a_lanes_damaged_frame_is_one_line(small_container, tmp_path):  # noqa: F811
    """Chunk 1 is the second context's: its damaged frame is named, and no statistics follow."""
    data = small_container.read_bytes()
    index_offset, index, _ = container_tail(data)
    offset, length = (int(x) for x in np.frombuffer(index, "<u8").reshape(-1, 2)[-1])
    bad = tmp_path / "bad.kldt"
    bad.write_bytes(data[:offset] + b"\0" * 16 + data[offset + 16:])
    p = fail("compare", "--kl-divergence-base", bad, "-b", 128, "-t", 2, "--contexts", 2)
    assert "2 lanes side by side" in p.stderr
    one_line_error(p, errors.CorruptData, "bad.kldt", "corrupt zstd frame for chunk 1", f"offset {offset}")
    assert "Mean    KLD" not in p.stdout


def test_contexts_only_for_llamacpp(tmp_path):
    p = fail("ppl", "--engine", "transformers", "--contexts", 2, "-f", WIKI, "--chunks", 1)
    one_line_error(p, errors.UsageError, "--contexts 2", "only for --engine llamacpp")
    p = fail("ppl", "--contexts", 0, "-f", WIKI, "--chunks", 1)
    one_line_error(p, errors.UsageError, "--contexts 0", "at least 1")
    p = fail("base", "--contexts", 2, "-f", WIKI, "--chunks", 1, "--kl-divergence-base", tmp_path / "b.kldt")
    one_line_error(p, errors.UsageError, "--contexts 2", "for compare and ppl")
    assert not list(tmp_path.iterdir())
