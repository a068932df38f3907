"""Frames of at most R rows inside a window (issue 22): files written before frames read
unchanged, long windows written and compared block by block with the same statistics as the
one-frame layout, and a recurrent custom model run block by block through the python
engine's step API with the results of the whole-window call."""

import json

import numpy as np
import pytest

from conftest import ROOT, WIKI, run_cli
from kldtool import errors
from kldtool.logitsfile import open_base_file

pytestmark = pytest.mark.quick

HELPERS = ROOT / "tests" / "helpers"
BASE = f"{HELPERS / 'tiny_lm.py'}:make_base"
QUANT = f"{HELPERS / 'tiny_lm.py'}:make_quant"
ONE_FRAME = ROOT / "tests" / "fixtures" / "one_frame"
# The runs that wrote the fixtures (see their README.md): one frame per window, by the code
# before frames existed.
FIXTURE_RUNS = {
    "llamacpp_chunks.kldt": ["-c", 64, "--chunks", 3],
    "exl3_windows.kldt": ["--protocol", "exl3", "-c", 96, "--stride", 48, "--chunks", 3],
}
TINY = ["--engine", "python"]


def _compare(base, tmp_path, *args) -> dict:
    out = tmp_path / f"c{len(list(tmp_path.glob('c*.json')))}.json"
    run_cli("compare", *TINY, "-m", QUANT, "--kl-divergence-base", base, "--json", out, *args)
    return json.loads(out.read_text())


def _same_rows(a, b, codes: int = 0) -> None:
    """The same header, tokens and rows, every code within ``codes`` of the other's."""
    ra, rb = open_base_file(a), open_base_file(b)
    try:
        assert ra.header == rb.header and np.array_equal(ra.tokens, rb.tokens)
        for c in range(ra.header.n_chunk):
            x, y = ra.read_chunk(c), rb.read_chunk(c)
            if not codes:
                assert np.array_equal(x, y), f"chunk {c}"
                continue
            x, y = (r.astype(np.int64) for r in (x, y))
            head = x[:, :4].astype("<u2").view(np.float32), y[:, :4].astype("<u2").view(np.float32)
            assert np.allclose(*head, rtol=1e-5, atol=1e-5), f"chunk {c}: row heads"
            assert np.abs(x[:, 4:] - y[:, 4:]).max() <= codes, f"chunk {c}"
    finally:
        ra.close()
        rb.close()


@pytest.mark.needs_shared  # the files were written over WikiText-2, and the fresh runs must read it too
@pytest.mark.parametrize("name", sorted(FIXTURE_RUNS))
def test_files_from_before_frames_read_unchanged(name, tmp_path):
    old = ONE_FRAME / name
    r = open_base_file(old)
    assert r.frames.per_frame == 0 and r.frames.n_frames == r.header.n_chunk  # one frame a window
    r.close()
    # Re-framed losslessly: the same rows, bit for bit, in frames of 7 rows.
    framed = tmp_path / f"framed-{name}"
    run_cli("convert", old, framed, "--to", "kldtool", "--frame-rows", 7)
    info = json.loads(run_cli("info", framed, "--json").stdout)
    assert info["rows_per_frame"] == 7 and info["largest_frame_rows"] == 7
    assert info["frames"] == sum(-(-n // 7) for n in _rows_of(old))
    assert info["largest_frame_bytes"] == 7 * (256 + 4) * 2
    _same_rows(old, framed)
    if name.startswith("llamacpp"):  # and on to llama.cpp's raw layout, a frame at a time
        raw = tmp_path / "raw.kld"
        run_cli("convert", framed, raw, "--to", "llamacpp")
        _same_rows(old, raw)
    a, b = _compare(old, tmp_path), _compare(framed, tmp_path)
    assert a["statistics"] == b["statistics"]
    assert a["base_file"]["rows_per_frame"] == "window" and b["base_file"]["largest_frame_rows"] == 7
    # The same run today (the same batches, so the same logits), in frames and in one frame a
    # window: the same rows, bit for bit. Against the fixture, within one code: torch's kernels
    # differ in the last bits between CPUs (this fixture came from an AVX2 machine; an AVX-512
    # one moves ~0.1 % of the codes by one).
    fresh = {}
    for rows in (7, 0):
        fresh[rows] = tmp_path / f"fresh-{rows}-{name}"
        run_cli(
            "base",
            *TINY,
            "-m",
            BASE,
            "-f",
            WIKI,
            *FIXTURE_RUNS[name],
            "--frame-rows",
            rows,
            "--kl-divergence-base",
            fresh[rows],
        )
    _same_rows(fresh[0], fresh[7])
    _same_rows(old, fresh[7], codes=1)


def _rows_of(path) -> list[int]:
    r = open_base_file(path)
    try:
        return [r.header.rows_of(c) for c in range(r.header.n_chunk)]
    finally:
        r.close()


@pytest.fixture(scope="module")
def long_docs(tmp_path_factory):
    """Three documents of 17,000 bytes (tokens, to the byte-level model) of WikiText."""
    path = tmp_path_factory.mktemp("long") / "docs.jsonl"
    text = WIKI.read_text(encoding="utf-8")
    path.write_text("".join(json.dumps({"text": text[i * 17000 : (i + 1) * 17000]}) + "\n" for i in range(3)))
    return path


@pytest.mark.full_tier
def test_step_api_runs_long_documents_block_by_block(long_docs, tmp_path):
    """tiny_lm's step(ids, state) carries the GRU's state from block to block: the same
    perplexities at every length as the whole-window call."""
    runs = {}
    for b in (512, 20000):  # 20000: every window in one logits(ids) call
        out = tmp_path / f"p{b}.json"
        run_cli(
            "ppl",
            *TINY,
            "-m",
            BASE,
            "-f",
            long_docs,
            "--protocol",
            "documents",
            "--lengths",
            "1024,5120,10240,16384",
            "-b",
            b,
            "--json",
            out,
        )
        runs[b] = json.loads(out.read_text())
    block, whole = runs[512], runs[20000]
    # One window per document, its longest length; the shorter lengths are its prefixes.
    assert block["scored_tokens"] == whole["scored_tokens"] == 3 * 16383
    assert [x["tokens"] for x in block["per_length"]] == [3 * 1023, 3 * 5119, 3 * 10239, 3 * 16383]
    for x, y in zip(block["per_length"], whole["per_length"]):
        assert x["ppl"] == pytest.approx(y["ppl"], rel=1e-9)


@pytest.mark.full_tier
def test_long_window_base_and_compare_in_frames_equal_one_frame(tmp_path):
    """Windows of 3,000 tokens from blocks of 256 rows, stored in frames of 100 rows (written
    as the blocks come, read back block by block): the one-frame layout's rows and statistics."""
    window = ["-f", WIKI, "--protocol", "exl3", "-c", 3000, "--stride", 3000, "--chunks", 2, "-b", 256]
    framed, whole = tmp_path / "framed.kldt", tmp_path / "whole.kldt"
    run_cli("base", *TINY, "-m", BASE, *window, "--frame-rows", 100, "--kl-divergence-base", framed)
    run_cli("base", *TINY, "-m", BASE, *window, "--frame-rows", 0, "--kl-divergence-base", whole)
    r = open_base_file(framed)
    assert r.frames.n_frames == 2 * 30 and r.frame_nbytes == 100 * 260 * 2
    r.close()
    _same_rows(framed, whole)
    a, b = _compare(framed, tmp_path, "-b", 256), _compare(whole, tmp_path, "-b", 256)
    assert a["scored_tokens"] == b["scored_tokens"] == 2 * 2999
    assert a["statistics"] == b["statistics"]


def test_frame_rows_flag_errors(tmp_path):
    p = run_cli(
        "base",
        *TINY,
        "-m",
        BASE,
        "-f",
        WIKI,
        "-c",
        64,
        "--chunks",
        1,
        "--format",
        "llamacpp",
        "--frame-rows",
        8,
        "--kl-divergence-base",
        tmp_path / "x.kld",
        check_rc=None,
    )
    assert p.returncode == errors.UsageError.exit_code and "--frame-rows" in p.stderr.splitlines()[-1]
    p = run_cli(
        "base",
        *TINY,
        "-m",
        BASE,
        "-f",
        WIKI,
        "-c",
        64,
        "--chunks",
        1,
        "--frame-rows",
        -1,
        "--kl-divergence-base",
        tmp_path / "x.kldt",
        check_rc=None,
    )
    assert p.returncode == errors.UsageError.exit_code and "--frame-rows -1" in p.stderr.splitlines()[-1]
    assert not list(tmp_path.iterdir())
