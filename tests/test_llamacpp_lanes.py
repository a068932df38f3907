"""compare on llama.cpp in several contexts side by side (engines/llamacpp/lanes.py): the same printed
lines as llama-perplexity and as one context, whatever batch or piece of a batch falls on which
context; a lane's error ends the run in one line like any other."""

import hashlib

import numpy as np
import pytest

from conftest import llamacpp_reference, WIKI, assert_lines_match, chunk_table_lines, final_block_lines, run_cli
from kldtool import errors
from kldtool.engines.llamacpp.engine import LlamaCppEngine
from kldtool.engines.llamacpp.pieces import same_kernels
from kldtool.text.protocols import Window, llamacpp_windows
from test_cli_errors import container_tail, fail, one_line_error, small_container, small_raw  # noqa: F401


@pytest.mark.parametrize("batch,chunks,per_call", [(256, 8, 1), (640, 8, 5), (256, 5, 1)])
def test_two_contexts_print_llama_perplexitys_lines(requant, fixture_base, batch, chunks, per_call):
    """c=128. -b 256: batches of 2 chunks whose ubatches are whole chunks, cut into single
    chunks, four on each context. -b 640: batches of 5 and 3 chunks, whose ubatches hold 102 and
    170 positions of each chunk (510 rows, not in fours): kept whole, one on each context (and
    other bits than llama-perplexity's 8-chunk batch, so only one context is the reference).
    --chunks 5 at -b 256: the fifth chunk runs once both contexts are done, with both threads."""
    model = requant("Q2_K")
    args = ("compare", "--kl-divergence-base", fixture_base, "-m", model, "-b", batch, "-t", 2, "--chunks", chunks)
    two = run_cli(*args, "--contexts", 2)
    one = run_cli(*args, "--contexts", 1)
    assert f"2 lanes side by side (1+1 threads, {per_call} window{'s' if per_call > 1 else ''} a call)" in two.stderr
    assert "lanes" not in one.stderr
    assert two.stdout == one.stdout
    if per_call > 1:
        return
    theirs = llamacpp_reference("compare-Q2_K.txt").read_text()
    assert_lines_match(chunk_table_lines(two.stdout), chunk_table_lines(theirs)[:chunks])
    if chunks == 8:
        assert_lines_match(final_block_lines(two.stdout), final_block_lines(theirs))


def _windows(n_windows: int, n_ctx: int) -> list[Window]:
    tokens = np.arange(n_windows * n_ctx, dtype=np.int32)
    return llamacpp_windows(tokens, n_ctx, n_windows, None)


@pytest.mark.parametrize(
    "n_windows,n_ctx,ubatch,same",
    [
        (4, 512, 512, True),  # 128 positions of each chunk a ubatch (c=512 -b 2048)
        (1, 512, 512, True),
        (3, 512, 512, False),  # 170 positions each: 510 rows, two through the other kernel
        (8, 128, 512, True),  # 64 each: flash attention's tiled kernel still
        (16, 128, 512, False),  # 32 each: its one-by-one kernel, unlike a smaller piece's
        (5, 384, 512, False),
    ],
)
@pytest.mark.quick
def test_which_batches_keep_their_kernels(n_windows, n_ctx, ubatch, same):
    """llama.cpp's equal split as perplexity's context makes it (a KV stream per sequence)."""
    assert same_kernels(_windows(n_windows, n_ctx), ubatch) is same


def test_pieces_decode_bit_identical_logits(q4_1_gguf):
    """c=256, -b 1024: a batch of 4 chunks (128 positions of each a ubatch) and the same chunks
    one by one in a lane's context give the same logits to the bit."""
    engine = LlamaCppEngine(str(q4_1_gguf), threads=2, batch_tokens=1024, contexts=2)
    try:
        text = WIKI.read_bytes()[:60000]
        batch = llamacpp_windows(engine.tokenize(text), 256, 4, engine.bos_id)
        whole = [hashlib.sha256(lg.tobytes()).hexdigest() for lg in engine.logits(batch)]
        lane = engine.lanes(4)[0]
        pieces = engine.lane_pieces(batch)
        assert [len(p) for p in pieces] == [1, 1, 1, 1]
        cut = [hashlib.sha256(lg.tobytes()).hexdigest() for p in pieces for lg in lane.logits(p)]
        lane.close()
    finally:
        engine.close()
    assert cut == whole


def test_beside_starts_once_every_lane_is_ready(q4_1_gguf):
    """What compare starts beside the lanes (the reducer's warm-up) waits for every lane's
    context, so an import holding the interpreter cannot hold up their first decodes; the
    lanes' results still arrive in batch order."""
    engine = LlamaCppEngine(str(q4_1_gguf), threads=2, batch_tokens=1024, contexts=2)
    seen = []
    try:
        text = WIKI.read_bytes()[:60000]
        windows = llamacpp_windows(engine.tokenize(text), 256, 4, engine.bos_id)
        schedule = engine.schedule([windows])
        lanes = schedule.lanes
        assert len(lanes) == 2 and len(schedule.calls) == 4 and schedule.reducer_loops() == (True, False)
        got = schedule.run(
            lambda lane, batch, _: [w.index for w in batch],
            beside=lambda: seen.append([lane.ctx is not None for lane in lanes]),
        )
        order = [r for _, r in got]
    finally:
        engine.close()
    assert seen == [[True, True]]
    assert order == [[0], [1], [2], [3]]


def test_a_lanes_damaged_frame_is_one_line(small_container, tmp_path):  # noqa: F811
    """Chunk 1 is the second context's: its damaged frame is named, and no statistics follow."""
    data = small_container.read_bytes()
    index_offset, index, _ = container_tail(data)
    offset, length = (int(x) for x in np.frombuffer(index, "<u8").reshape(-1, 2)[-1])
    bad = tmp_path / "bad.kldt"
    bad.write_bytes(data[:offset] + b"\0" * 16 + data[offset + 16 :])
    p = fail("compare", "--kl-divergence-base", bad, "-b", 128, "-t", 2, "--contexts", 2)
    assert "2 lanes side by side" in p.stderr
    one_line_error(p, errors.CorruptData, "bad.kldt", "corrupt zstd frame for chunk 1", f"offset {offset}")
    assert "Mean    KLD" not in p.stdout


@pytest.mark.quick
def test_contexts_only_for_llamacpp(tmp_path):
    p = fail("ppl", "--engine", "transformers", "--contexts", 2, "-f", WIKI, "--chunks", 1)
    one_line_error(p, errors.UsageError, "--contexts 2", "only for --engine llamacpp")
    p = fail("ppl", "--contexts", 0, "-f", WIKI, "--chunks", 1)
    one_line_error(p, errors.UsageError, "--contexts 0", "at least 1")
    p = fail("base", "--contexts", 2, "-f", WIKI, "--chunks", 1, "--kl-divergence-base", tmp_path / "b.kldt")
    one_line_error(p, errors.UsageError, "--contexts 2", "for compare and ppl")
    assert not list(tmp_path.iterdir())
