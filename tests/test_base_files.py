"""Base-file formats against the files llama-perplexity wrote."""

import os

import numpy as np
import pytest

from conftest import llamacpp_reference, SHA, run_cli, sha256
from helpers.claimed import claimed
from kldtool.codec import decode_np
from kldtool.errors import BaseFileError
from kldtool.logitsfile import create_writer, iter_chunks, open_base_file
from kldtool.stats.summary import mean_unc

pytestmark = pytest.mark.quick


def _printed_base_ppl(name="compare-Q2_K.txt"):
    for line in llamacpp_reference(name).read_text().splitlines():
        if line.startswith("Mean PPL(base)"):
            v, u = line.split(":")[1].split("±")
            return float(v), float(u)


@pytest.mark.needs_shared  # llama-perplexity's own file
def test_reads_llamacpp_header_and_tokens(fixture_base):
    r = open_base_file(fixture_base)
    assert (r.header.n_ctx, r.header.n_vocab, r.header.n_chunk) == (128, 49152, 8)
    assert r.format_name == "llamacpp"
    assert r.tokens[0] == 18682  # "\r\n\r\n", the text's first token (docs/llama-perplexity-format.md §2)
    assert r.file_size == 49_553_364
    r.close()


def test_mean_ppl_base_from_the_file_alone(fixture_base):
    """Header, row layout, row/target alignment and the MU formula, checked in one number."""
    r = open_base_file(fixture_base)
    h = r.header
    nll = []
    for c in range(h.n_chunk):
        rows = r.read_chunk(c)
        targets = r.tokens[c * h.n_ctx + h.first + 1 : (c + 1) * h.n_ctx]
        lp = decode_np(rows, h.n_vocab)
        nll.append(-lp[np.arange(len(targets)), targets])
    nll = np.concatenate(nll).astype(np.float32)
    m, u = mean_unc(float(nll.astype(np.float64).sum()), float((nll * nll).astype(np.float64).sum()), len(nll))
    value, unc = _printed_base_ppl()
    assert f"{np.exp(m):10.6f}".strip() == f"{value:.6f}"
    assert f"{np.exp(m) * u:10.6f}".strip() == f"{unc:.6f}"
    r.close()


@pytest.mark.needs_shared  # llama-perplexity's own file
def test_raw_writer_reproduces_llamacpp_bytes(fixture_base, tmp_path):
    r = open_base_file(fixture_base)
    out = tmp_path / "copy.kld"
    w = create_writer(out, "llamacpp", r.header, r.tokens)
    for _, rows in iter_chunks(r, range(r.header.n_chunk)):
        w.write_chunk(rows)
    w.finish()
    assert sha256(out) == SHA["base"]
    r.close()


def test_container_is_small_and_lossless_and_convert_round_trips(fixture_base, tmp_path):
    packed, back = tmp_path / "base.kldt", tmp_path / "back.kld"
    run_cli("convert", fixture_base, packed)
    run_cli("convert", packed, back)
    ratio = os.path.getsize(packed) / os.path.getsize(fixture_base)
    print(f"container / raw = {ratio:.4f}")
    assert ratio <= claimed("container.ratio")  # issue 7: plain zstd -19 of the raw file reaches 0.487
    assert sha256(back) == sha256(fixture_base)  # llama-perplexity's own bytes, where shared/ is there
    a, b = open_base_file(fixture_base), open_base_file(packed)
    assert np.array_equal(a.tokens, b.tokens)
    for c in range(a.header.n_chunk):
        assert np.array_equal(a.read_chunk(c), b.read_chunk(c))
    assert b.metadata["converted_from"]["format"] == "llamacpp"
    info = run_cli("info", packed, "--json").stdout
    assert '"complete": true' in info and '"n_chunk": 8' in info


def _bad(tmp_path, name, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b"", "empty file"),
        (lambda b: b[:5], "truncated header"),
        (lambda b: b"_logits_" + b[8:12], "truncated header"),
        (lambda b: b"NOTLOGIT" + b[8:], "not a base file"),
        (lambda b: b[: 20 + 4 * 100], "truncated token table"),
        (lambda b: b[:-1000], "truncated rows: header promises 8 chunks"),
        (lambda b: b + b"xx", "unexpected bytes after the last chunk"),
        (lambda b: b[:16] + np.int32(2**31 - 1).tobytes() + b[20:], "truncated"),
        (lambda b: b[:8] + np.int32(-5).tobytes() + b[12:], "invalid header"),
    ],
)
def test_raw_reader_rejects_bad_files(fixture_base, tmp_path, mutate, message):
    data = fixture_base.read_bytes()
    p = _bad(tmp_path, "bad.kld", mutate(data))
    with pytest.raises(BaseFileError, match=message) as e:
        open_base_file(p)
    assert str(p) in str(e.value)


def test_lying_header_is_rejected_without_allocating(tmp_path):
    p = _bad(tmp_path, "liar.kld", b"_logits_" + np.array([512, 49152, 2**31 - 1], "<i4").tobytes() + b"\0" * 64)
    with pytest.raises(BaseFileError, match="truncated token table"):
        open_base_file(p)


@pytest.fixture(scope="module")
def small_container(fixture_base, tmp_path_factory):
    r = open_base_file(fixture_base)
    p = tmp_path_factory.mktemp("c") / "small.kldt"
    from kldtool.logitsfile.header import BaseHeader

    h = BaseHeader(n_ctx=r.header.n_ctx, n_vocab=r.header.n_vocab, n_chunk=2)
    # Frames of 20 rows: each chunk's 63 rows are 4 frames, the last of 3 rows; the rows
    # come in blocks of 25 that cut across frames, as an engine's blocks do.
    w = create_writer(p, "kldtool", h, r.tokens[: h.n_tokens], {"note": "two chunks"}, frame_rows=20)
    for c in range(2):
        rows = r.read_chunk(c)
        for a in range(0, len(rows), 25):
            w.write_rows(rows[a : a + 25])
        w.end_chunk()
    w.finish()
    r.close()
    return p


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b[:-1], "incomplete container"),
        (lambda b: b[: len(b) // 2], "incomplete container"),
        (lambda b: b[:20], "truncated header"),
        (lambda b: b[:8] + np.uint32(9).tobytes() + b[12:], "container version 9"),
        (lambda b: b[:-40] + bytes([b[-40] ^ 0xFF]) + b[-39:], "checksum mismatch"),
    ],
)
def test_container_reader_rejects_bad_files(small_container, tmp_path, mutate, message):
    p = _bad(tmp_path, "bad.kldt", mutate(small_container.read_bytes()))
    with pytest.raises(BaseFileError, match=message):
        open_base_file(p)


def test_corrupt_frame_is_reported_with_its_chunk(small_container, tmp_path):
    data = bytearray(small_container.read_bytes())
    r = open_base_file(small_container)
    assert r.frames.n_frames == 8 and list(r.frames.of_chunk(1)) == [4, 5, 6, 7]
    off, length = (int(x) for x in r.index[5])
    r.close()
    data[off + length // 2] ^= 0x55
    p = _bad(tmp_path, "corrupt.kldt", bytes(data))
    r = open_base_file(p)
    r.read_chunk(0)
    r.read_rows(1, 0, 20)  # frame 4 is whole
    with pytest.raises(BaseFileError, match=r"chunk 1 \(frame 5\)"):
        r.read_chunk(1)
    r.close()


def test_frames_rebuilt_with_torch_equal_the_rows(small_container, fixture_base):
    """The GPU path (threads only decompress and check a frame's size against its mask; the
    mask and byte planes are rebuilt into rows where the model runs), run here on the CPU: bit
    for bit the fixture's rows."""
    import torch

    def on_device(data):  # what frame_to_torch hands over on a GPU: the frame's bytes, copied as they are
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    r, ref = open_base_file(small_container), open_base_file(fixture_base)
    assert type(r.form).__name__ == "MaskedPlanes"
    for k in range(r.frames.n_frames):
        chunk, row0, n = r.frames.span(k)
        frame = r.read_frame(k)
        rows = r.form.rows_torch(on_device(frame.data), n)
        assert np.array_equal(rows.numpy().view(np.uint16), ref.read_rows(chunk, row0, row0 + n))
    head_len = n * 8
    assert r.form.problem(frame.data, n) is None
    bad = bytearray(frame.data)
    bad[head_len] = 0 if bad[head_len] else 0xFF  # the mask now counts other codes than the planes hold
    # what read_frame refuses before any device sees it
    assert r.form.problem(bytes(bad), n).startswith("masked frame of")
    r.close()
    ref.close()


def test_chunk_feed_serves_chunks_in_any_order(small_container):
    """vLLM's workers ask for a request's chunk once per prefill step, requests interleaved."""
    from kldtool.logitsfile.prefetch import ChunkFeed

    r = open_base_file(small_container)
    feed = ChunkFeed(r, "cpu")
    whole = [r.read_chunk(c) for c in range(2)]
    for c, a, b in ((0, 0, 63), (0, 10, 45), (1, 0, 7), (0, 45, 63), (1, 7, 63), (1, 60, 63), (0, 19, 21)):
        assert np.array_equal(feed.rows(c, a, b).numpy().view(np.uint16), whole[c][a:b])
    feed.close()
    r.close()


def test_writer_abort_leaves_nothing(tmp_path, fixture_base):
    r = open_base_file(fixture_base)
    out = tmp_path / "never.kldt"
    w = create_writer(out, "kldtool", r.header, r.tokens)
    w.write_chunk(r.read_chunk(0))
    w.abort()
    assert list(tmp_path.iterdir()) == []
    r.close()
