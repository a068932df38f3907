"""Property shared by the fuzz test and ``scripts/fuzz_reader.py``: whatever bytes a base file
holds, opening it and reading every chunk either works or raises one of our BaseFileErrors,
and never allocates more than a real chunk of the header's shape would need.

The seeds are tiny real files of both formats (random logits through the codec, and random
hidden states with a random head, and with a GGUF Q8_0 one); mutations
overwrite header and trailer fields with boundary values, flip and insert bytes, truncate.
"""

from __future__ import annotations

import os
import re
import tempfile
import tracemalloc

import numpy as np
from hypothesis import strategies as st

from kldtool.codec import encode_np
from kldtool.errors import BaseFileError
from kldtool.codec.rows_compiled import warm
from kldtool.logitsfile import create_writer, open_base_file
from kldtool.logitsfile.header import BaseHeader

N_CTX, N_VOCAB, N_CHUNK = 8, 40, 3
LIMIT = 2 << 20  # bytes: a real chunk of the seed's shape is ~300 bytes


def seed_files(directory: str) -> dict[str, bytes]:
    """{format: bytes} of one valid base file each."""
    rng = np.random.default_rng(0)
    header = BaseHeader(n_ctx=N_CTX, n_vocab=N_VOCAB, n_chunk=N_CHUNK)
    tokens = rng.integers(0, N_VOCAB, N_CTX * N_CHUNK).astype(np.int32)
    out = {}
    # kldtool: one frame per chunk (the layout before frames), and frames of 2 rows (3 per chunk
    # of 3 rows: 2 + 1), so the trailer's rows-per-frame and the per-frame index are fuzzed too.
    for name, fmt, frame_rows in (
        ("llamacpp", "llamacpp", None),
        ("kldtool", "kldtool", 0),
        ("kldtool-framed", "kldtool", 2),
    ):
        path = os.path.join(directory, f"seed-{name}")
        w = create_writer(path, fmt, header, tokens, {"seed": True}, frame_rows=frame_rows)
        for _ in range(N_CHUNK):
            logits = rng.normal(0, 4, (header.rows_per_chunk, N_VOCAB)).astype(np.float32)
            logits[0] = 0  # a scale-0 row
            w.write_chunk(encode_np(logits)[0])
        w.finish()
        with open(path, "rb") as f:
            out[name] = f.read()
    out["kldtool-hidden"] = _hidden_seed(directory, header, tokens, rng)
    out["kldtool-hidden-gguf"] = _hidden_seed(directory, header, tokens, rng, gguf=True)
    return out


def _hidden_seed(directory: str, header: BaseHeader, tokens: np.ndarray, rng, gguf: bool = False) -> bytes:
    """A hidden-state container: float32 states, frames of 2 rows, and a head with a bias of 6
    dimensions, or (``gguf``) a llama.cpp Q8_0 head of 32: one block a row, an fp16 scale and
    32 int8 weights."""
    import torch

    from kldtool.logitsfile.hidden import OutputHead

    dim = 32 if gguf else 6
    path = os.path.join(directory, "seed-kldtool-hidden" + ("-gguf" if gguf else ""))
    w = create_writer(
        path,
        "kldtool",
        header,
        tokens,
        {"seed": True, "store": "hidden", "hidden": {"dim": dim, "dtype": "float32"}},
        frame_rows=2,
    )
    if gguf:
        blocks = np.zeros((N_VOCAB, 34), np.uint8)
        blocks[:, :2] = rng.uniform(0.001, 0.05, (N_VOCAB, 1)).astype("<f2").view(np.uint8)
        blocks[:, 2:] = rng.integers(-127, 128, (N_VOCAB, 32)).astype(np.int8).view(np.uint8)
        w.set_head(
            OutputHead(
                weight=blocks.reshape(-1), bias=None, multiplier=None, softcap=None, ggml="q8_0", shape=(N_VOCAB, dim)
            )
        )
    else:
        w.set_head(
            OutputHead(
                weight=torch.from_numpy(rng.normal(0, 1, (N_VOCAB, dim)).astype(np.float32)),
                bias=torch.from_numpy(rng.normal(0, 1, N_VOCAB).astype(np.float32)),
            )
        )
    for _ in range(N_CHUNK):
        w.write_chunk(rng.normal(0, 2, (header.rows_per_chunk, dim)).astype(np.float32))
    w.finish()
    with open(path, "rb") as f:
        return f.read()


BOUNDARY = [0, 1, 2, 3, 4, 7, 8, 40, 255, 256, 2**15, 2**16, 2**24, 2**24 + 1, 2**31 - 1, 2**31, 2**32 - 1]
WIDTH = {4: "<u4", 8: "<u8"}


def _put(data: bytearray, offset: int, value: int, width: int) -> None:
    if 0 <= offset <= len(data) - width:
        data[offset : offset + width] = np.array([value % (1 << (8 * width))], WIDTH[width]).tobytes()


@st.composite
def mutated(draw, seeds: dict[str, bytes]) -> bytes:
    data = bytearray(seeds[draw(st.sampled_from(sorted(seeds)))])
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["field", "tail field", "flip", "insert", "truncate", "zero run"]))
        if op == "field":  # header: magic/version/n_ctx/n_vocab/n_chunk/transform all sit in 0..32
            _put(data, draw(st.sampled_from(range(8, 32, 4))), draw(st.sampled_from(BOUNDARY)), 4)
        elif op == "tail field":  # container trailer: index offset, metadata length, crc
            width = draw(st.sampled_from([4, 8]))
            _put(data, len(data) - draw(st.sampled_from([32, 24, 16])), draw(st.sampled_from(BOUNDARY)), width)
        elif op == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= draw(st.integers(1, 255))
        elif op == "insert":
            i = draw(st.integers(0, len(data)))
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif op == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif op == "zero run" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i : i + draw(st.integers(1, 64))] = bytes(min(len(data) - i, 64))
    return bytes(data)


def check_reader_survives(data: bytes, directory: str) -> str:
    """Open and fully read ``data``; returns "ok" or the error's first words (numbers as N), a
    coarse class for the script's tally. Anything but a
    BaseFileError, or a peak allocation over LIMIT, fails the property."""
    fd, path = tempfile.mkstemp(dir=directory)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    warm()  # numba loads a GGUF head's compiled replay encoder once per process: not the file's doing
    tracemalloc.start()
    try:
        reader = open_base_file(path)
        try:
            for c in range(reader.header.n_chunk):
                rows = reader.read_chunk(c)
                assert rows.shape == (reader.header.rows_per_chunk, reader.header.row_width)
        finally:
            reader.close()
        outcome = "ok"
    except BaseFileError as e:
        assert str(e).startswith(path), str(e)
        outcome = " ".join(re.sub(r"\d+", "N", str(e)[len(path) + 2 :].split("(")[0]).split()[:6])
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        os.unlink(path)
    assert peak < LIMIT, f"peak allocation {peak} bytes reading a {len(data)}-byte file"
    return outcome
