"""Bad input ends in one line naming what and where, a class-specific exit code, no traceback,
and no output file that looks complete. Every broken file here is made from a real base file
(the llama-perplexity fixture, cut to two chunks) by the one change the case is about."""

import json

import numpy as np
import pytest

from conftest import WIKI, run_cli
from kldtool import errors
from helpers.container_edit import container_tail, with_metadata
from kldtool.logitsfile import container

pytestmark = pytest.mark.quick


def one_line_error(p, cls, *needles):
    """The run failed with ``cls``'s exit code and a single stderr line holding every needle."""
    assert p.returncode == cls.exit_code, p.stderr
    assert "Traceback" not in p.stderr
    err = [l for l in p.stderr.splitlines() if l.strip() and not l.startswith(("note:", "warning:", "llama"))]
    msg = err[-1]
    assert msg.startswith("kldtool: "), msg
    for n in needles:
        assert n in msg, msg
    return msg


def fail(*args):
    return run_cli(*args, check_rc=None)


# ---- small real base files, and ways to break them -------------------------------------------


@pytest.fixture(scope="module")
def small_raw(fixture_base, tmp_path_factory):
    """The fixture's first two chunks as a llama.cpp raw file (a valid base file)."""
    from kldtool.logitsfile import open_base_file

    src = open_base_file(fixture_base)
    h = src.header
    out = tmp_path_factory.mktemp("small") / "small.kld"
    with open(out, "wb") as f:
        f.write(b"_logits_" + np.array([h.n_ctx, h.n_vocab, 2], "<i4").tobytes())
        f.write(src.tokens[: 2 * h.n_ctx].astype("<i4").tobytes())
        for c in range(2):
            f.write(src.read_chunk(c).tobytes())
    src.close()
    return out


@pytest.fixture(scope="module")
def small_container(small_raw):
    out = small_raw.with_suffix(".kldt")
    run_cli("convert", small_raw, out)
    return out


def flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0xFF]) + data[offset + 1 :]


def first_frame(data: bytes) -> tuple[int, int]:
    index_offset, index, _ = container_tail(data)
    offset, length = (int(x) for x in np.frombuffer(index, "<u8", 2))
    return offset, length


RAW_CASES = {  # name: (how to break the bytes, error class, words the message must hold)
    "wrong magic": (lambda d: b"_LOGITS_" + d[8:], errors.NotABaseFile, ["not a base file", "bytes 0-7"]),
    "empty": (lambda d: b"", errors.TruncatedHeader, ["empty file"]),
    "truncated header": (lambda d: d[:14], errors.TruncatedHeader, ["truncated header", "14 bytes"]),
    "truncated tokens": (lambda d: d[: 20 + 4 * 100], errors.TruncatedHeader, ["truncated token table", "offset 1044"]),
    "truncated rows": (lambda d: d[:-1000], errors.TruncatedRows, ["truncated rows", "1 complete chunks", "chunk 1"]),
    "extra bytes": (lambda d: d + b"\0" * 6, errors.RowLayoutError, ["6 unexpected bytes", "n_ctx=128"]),
    "n_ctx too small": (
        lambda d: d[:8] + np.int32(2).tobytes() + d[12:],
        errors.NotABaseFile,
        ["invalid header at offset 8", "n_ctx 2"],
    ),
    "token outside vocab": (
        lambda d: d[: 20 + 4 * 130] + np.int32(60000).tobytes() + d[20 + 4 * 131 :],
        errors.CorruptData,
        ["token 60000", f"offset {20 + 4 * 130}", "chunk 1"],
    ),
    "lying n_chunk": (
        lambda d: d[:16] + np.int32(2**31 - 1).tobytes() + d[20:],
        errors.TruncatedHeader,
        ["truncated token table"],
    ),
}

CONTAINER_CASES = {
    "unsupported version": (
        lambda d: d[:8] + np.uint32(99).tobytes() + d[12:],
        errors.NotABaseFile,
        ["container version 99", "offset 8"],
    ),
    "no completion marker": (
        lambda d: d[: -container.TRAILER],
        errors.IncompleteFile,
        ["incomplete container", "did not finish"],
    ),
    "cut in the frames": (lambda d: d[: first_frame(d)[0] + 100], errors.IncompleteFile, ["incomplete container"]),
    "corrupt index": (
        lambda d: flip(d, container_tail(d)[0] + 3),
        errors.CorruptData,
        ["corrupt index or metadata", "checksum"],
    ),
    "metadata not JSON": (
        lambda d: with_metadata(d, b"{not json"),
        errors.MetadataError,
        ["metadata at offset", "does not parse"],
    ),
    "metadata not an object": (lambda d: with_metadata(d, b"[1, 2]"), errors.MetadataError, ["not a JSON object"]),
}


@pytest.mark.parametrize(
    "fmt, case", [("llamacpp", c) for c in sorted(RAW_CASES)] + [("kldtool", c) for c in sorted(CONTAINER_CASES)]
)
def test_broken_file(small_raw, small_container, tmp_path, fmt, case):
    breaker, cls, needles = (RAW_CASES if fmt == "llamacpp" else CONTAINER_CASES)[case]
    good = small_raw if fmt == "llamacpp" else small_container
    bad = tmp_path / f"bad{good.suffix}"
    bad.write_bytes(breaker(good.read_bytes()))
    one_line_error(fail("info", bad), cls, bad.name, *needles)
    one_line_error(fail("compare", "--kl-divergence-base", bad), cls, bad.name, *needles)


def test_corrupt_zstd_frame_names_the_chunk(small_container, tmp_path):
    """The frames are not under the checksum (it would mean reading the whole file up front):
    a damaged one is found when its chunk is read, and named."""
    data = small_container.read_bytes()
    offset, length = first_frame(data)
    bad = tmp_path / "bad.kldt"
    bad.write_bytes(data[:offset] + b"\0" * 16 + data[offset + 16 :])
    p = fail("compare", "--kl-divergence-base", bad)
    one_line_error(p, errors.CorruptData, "bad.kldt", "corrupt zstd frame for chunk 0", f"offset {offset}")
    assert "[1]" not in p.stdout  # no statistics from a file that lies


def test_missing_file_and_directory(tmp_path):
    one_line_error(
        fail("compare", "--kl-divergence-base", tmp_path / "nope.kld"), errors.BaseFileError, "nope.kld", "no such file"
    )
    one_line_error(fail("info", tmp_path), errors.BaseFileError, "is a directory")


def test_truncated_llama_perplexity_file(fixture_base, tmp_path):
    """What an interrupted llama-perplexity leaves: the header promises 8 chunks."""
    bad = tmp_path / "cut.kld"
    bad.write_bytes(fixture_base.read_bytes()[:30_000_000])
    one_line_error(
        fail("compare", "--kl-divergence-base", bad),
        errors.TruncatedRows,
        "cut.kld",
        "truncated rows",
        "promises 8 chunks",
        "chunk 4",
    )


# ---- model and base file that do not belong together ---------------------------------------


def test_vocab_mismatch(tmp_path, q4_1_gguf):
    f = tmp_path / "v1000.kld"
    n_ctx, v = 8, 1000
    rows = np.zeros((2 * (n_ctx - 1 - n_ctx // 2), v + 4), np.uint16)
    f.write_bytes(
        b"_logits_" + np.array([n_ctx, v, 2], "<i4").tobytes() + np.zeros(16, "<i4").tobytes() + rows.tobytes()
    )
    p = fail("compare", "--kl-divergence-base", f, "-m", q4_1_gguf)
    one_line_error(p, errors.VocabMismatch, "v1000.kld", "vocabulary of 1000", "49152")


@pytest.mark.full_tier
def test_tokenizer_mismatch_and_force(small_container, tmp_path, q4_1_gguf):
    data = small_container.read_bytes()
    meta = json.loads(container_tail(data)[2])
    meta["tokenizer_identity"] = "sha256:" + "0" * 64
    bad = tmp_path / "othertok.kldt"
    bad.write_bytes(with_metadata(data, json.dumps(meta).encode()))
    one_line_error(
        fail("compare", "--kl-divergence-base", bad, "-m", q4_1_gguf),
        errors.TokenizerMismatch,
        "othertok.kldt",
        "tokenizer differs",
        "--force",
    )
    p = run_cli("compare", "--kl-divergence-base", bad, "-m", q4_1_gguf, "--force", "--json", tmp_path / "r.json")
    assert "warning: FORCED:" in p.stderr and "tokenizer differs" in p.stderr
    assert any(l.startswith("warning: FORCED:") and "tokenizer differs" in l for l in p.stdout.splitlines())
    result = json.loads((tmp_path / "r.json").read_text())
    assert any("tokenizer differs" in w for w in result["warnings"])
    assert result["statistics"]["count"] == 2 * 63


def test_chunks_longer_than_the_model_context(tmp_path, q4_1_gguf):
    """A sparse file: the check happens before any row is read, so its holes never matter."""
    n_ctx, vocab = 16384, 49152
    f = tmp_path / "long.kld"
    with open(f, "wb") as out:
        out.write(b"_logits_" + np.array([n_ctx, vocab, 1], "<i4").tobytes() + np.zeros(n_ctx, "<i4").tobytes())
        out.truncate(20 + 4 * n_ctx + (n_ctx - 1 - n_ctx // 2) * (vocab + 4) * 2)
    one_line_error(
        fail("compare", "--kl-divergence-base", f, "-m", q4_1_gguf),
        errors.ContextTooLong,
        "long.kld",
        "16384 tokens",
        "context of 8192",
    )
    out = tmp_path / "b.kld"
    one_line_error(
        fail("base", "-m", q4_1_gguf, "-f", WIKI, "-c", 16384, "--kl-divergence-base", out),
        errors.ContextTooLong,
        "--ctx-size 16384",
        "8192",
    )
    assert not out.exists()
    # --force lets compare past the trained context as it does base and ppl, and says so
    from kldtool.engines.llamacpp.engine import LlamaCppEngine
    from kldtool.logitsfile import open_base_file
    from kldtool.pipeline.compat import check_compatible

    engine, reader = LlamaCppEngine(str(q4_1_gguf)), open_base_file(f)
    try:
        warnings = check_compatible(engine, reader, force=True)
    finally:
        engine.close()
        reader.close()
    assert [w for w in warnings if "16384 tokens exceed the model's context of 8192" in w and w.startswith("FORCED")]


# ---- text ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, cls, needle",
    [
        (b"", errors.EmptyText, "empty text"),
        (b"\n\n  \n", errors.EmptyText, "empty text"),
        (b"Hello world, far too short.\n", errors.TextTooShort, "at least 256"),
        (b"valid start \xff\xfe then junk" * 50, errors.UndecodableText, "offset 12"),
    ],
)
def test_bad_text(tmp_path, content, cls, needle):
    t = tmp_path / "t.txt"
    t.write_bytes(content)
    out = tmp_path / "b.kldt"
    p = fail("base", "-f", t, "-c", 128, "--kl-divergence-base", out)
    one_line_error(p, cls, "t.txt" if cls is not errors.TextTooShort else "", needle)
    assert not out.exists() and list(tmp_path.iterdir()) == [t]


def test_missing_text(tmp_path):
    one_line_error(
        fail("base", "-f", tmp_path / "no.txt", "--kl-divergence-base", tmp_path / "b.kld"),
        errors.CorpusError,
        "no.txt",
        "no such file",
    )


# ---- flags ---------------------------------------------------------------------------------


def test_bad_flags(tmp_path):
    one_line_error(fail("base", "--format", "zip"), errors.UsageError, "--format")
    one_line_error(fail("base", "--engine", "nope", "-f", __file__), errors.UsageError, "--engine")
    one_line_error(fail("compare"), errors.UsageError, "--kl-divergence-base")
    for p in (fail("base", "--no-such-flag"), fail("compare", "--kl-divergence-base", __file__, "-c", "abc")):
        assert p.returncode == 2 and "Traceback" not in p.stderr


@pytest.mark.full_tier
def test_llama_cpp_attention_flags(small_raw, tmp_path, q4_1_gguf):
    """--kv-cache-dtype and --flash-attn reach llama.cpp (its -ctk/-ctv and -fa) and are refused
    in one line elsewhere or with a value llama.cpp has no type for."""
    base = ("compare", "--kl-divergence-base", small_raw, "-m", q4_1_gguf)
    one_line_error(fail(*base, "--kv-cache-dtype", "q3"), errors.UsageError, "--kv-cache-dtype q3", "q8_0")
    one_line_error(fail(*base, "--flash-attn", "maybe"), errors.UsageError, "--flash-attn maybe")
    model = ("--engine", "transformers", "-m", "nope")
    one_line_error(fail(*base[:3], *model, "--flash-attn", "off"), errors.UsageError, "only for --engine llamacpp")
    one_line_error(fail(*base[:3], *model, "--kv-cache-dtype", "f32"), errors.UsageError, "vllm or llamacpp")
    out = tmp_path / "r.json"
    run_cli(*base, "--kv-cache-dtype", "q4_0", "--flash-attn", "on", "--json", out)
    r = json.loads(out.read_text())
    assert r["model"]["kv_cache"] == "q4_0" and r["model"]["flash_attn"] == "on"
    assert r["statistics"]["kld_mean"]["value"] > 1e-3  # the fixture's own model, its cache at 4 bits


def test_ctx_contradicting_the_file(small_raw):
    one_line_error(fail("compare", "--kl-divergence-base", small_raw, "-c", 512), errors.UsageError, "-c 512", "-c 128")


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--chunk-range", "5"], ["--chunk-range 5", "A:B", "<= 2"]),
        (["--chunk-range", "2:1"], ["--chunk-range 2:1"]),
        (["--chunk-range", "0:3"], ["--chunk-range 0:3", "<= 2", "small.kld"]),
        (["--chunk-range", "a:b"], ["--chunk-range a:b"]),
        (["--chunks", "0"], ["--chunks 0", "at least 1"]),
        (["--chunks", "1", "--chunk-range", "0:1"], ["contradict"]),
        (["--resume"], ["--resume needs --state"]),
        (["--checkpoint-every", "5"], ["--checkpoint-every needs --state"]),
        (["--state", "s.state", "--checkpoint-every", "soon"], ["--checkpoint-every soon"]),
    ],
)
def test_bad_subset_and_checkpoint_flags(small_raw, flags, needles, tmp_path):
    one_line_error(fail("compare", "--kl-divergence-base", small_raw, *flags), errors.UsageError, *needles)
    assert not (tmp_path / "s.state").exists()


def test_bad_state_file(small_raw, tmp_path):
    junk = tmp_path / "junk.state"
    junk.write_bytes(b"PK\x03\x04 but not a zip")
    one_line_error(
        fail("compare", "--kl-divergence-base", small_raw, "--state", junk, "--resume"),
        errors.StateError,
        "junk.state",
        "not a kldtool state file",
    )
    assert junk.read_bytes() == b"PK\x03\x04 but not a zip"  # never overwritten on a refusal


def test_the_exit_waits_for_threads_and_skips_the_teardown(tmp_path):
    """A library's teardown report (triton's nanobind leak lines) once printed below the one-line
    error when a worker thread was still alive at exit. The exit now waits for the worker (its
    file is written) and exits with the code, and nothing at teardown prints."""
    import subprocess
    import sys

    done = tmp_path / "worker-finished"
    script = f"""
import pathlib, time
from concurrent.futures import ThreadPoolExecutor
from kldtool.cli.app import _leave

class Teardown:
    def __del__(self):
        print("printed at teardown")

keep = Teardown()
pool = ThreadPoolExecutor(1)
pool.submit(lambda: (time.sleep(0.3), pathlib.Path({str(done)!r}).write_text("1")))
print("kldtool: error: the last line", flush=True)
_leave(5)
"""
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 5, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "kldtool: error: the last line"
    assert done.read_text() == "1"
