"""`kldtool quantize --tensor-type / --tensor-type-file`: per-tensor types through llama.cpp's
own quantize parameters (tt_overrides, llama-quantize's path), on the built-in SmolLM2. The
reference is the written GGUF itself, read by the gguf package, and llama.cpp's build of the
same source without the lines: with --pure, what no line sets is byte for byte that build's."""

import hashlib
import json

import numpy as np
import pytest

from conftest import WIKI, run_cli
from test_cli_errors import fail, one_line_error

# ffn_down takes 1,536 inputs (six K-quant blocks); attn_q and attn_v take 576, which K-quants
# cannot hold: llama.cpp writes its fallback instead (q4_k -> q5_0, q6_k -> q8_0), and says so.
LINES = (
    "# a mix for the test",
    r"blk\.0\.ffn_down\.weight=q3_k",
    r"blk\.1\.attn_q\.weight=Q4_K",
    "ffn_up=q5_1",
)
SET = {"blk.0.ffn_down.weight": "q3_k", "blk.1.attn_q.weight": "q5_0", "blk.2.attn_v.weight": "q8_0"}
SET |= {f"blk.{i}.ffn_up.weight": "q5_1" for i in range(30)}


def _tensors(path) -> dict:
    from gguf import GGUFReader

    return {t.name: (t.tensor_type.name.lower(), hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest())
            for t in GGUFReader(str(path)).tensors}  # fmt: skip


@pytest.fixture(scope="module")
def mix(q4_1_gguf, tmp_path_factory):
    d = tmp_path_factory.mktemp("mix")
    (d / "mix.txt").write_text("\n".join(LINES) + "\n")
    flags = ("--tensor-type-file", d / "mix.txt", "--tensor-type", r"blk\.2\.attn_v\.weight=q6_k")
    p = run_cli("quantize", q4_1_gguf, d / "mix.gguf", "Q8_0", "--pure", *flags, "--json", d / "mix.json")
    run_cli("quantize", q4_1_gguf, d / "again.gguf", "Q8_0", "--pure", *flags)
    run_cli("quantize", q4_1_gguf, d / "pure.gguf", "Q8_0", "--pure")
    return d, p


def test_each_line_decides_its_tensors_and_every_other_is_the_pure_builds(mix):
    d, p = mix
    got, pure = _tensors(d / "mix.gguf"), _tensors(d / "pure.gguf")
    assert got.keys() == pure.keys()
    for name, (kind, digest) in got.items():
        if name in SET:
            assert kind == SET[name], name
        else:
            assert (kind, digest) == pure[name], name
    # What the run reports it wrote is what the file holds; the fallbacks are named.
    rows = json.loads((d / "mix.json").read_text())["tensor_types"]
    assert [(r["pattern"], r["asked"], r["tensors"], r["written"]) for r in rows] == [
        (r"blk\.2\.attn_v\.weight", "q6_k", 1, {"q8_0": 1}),
        (r"blk\.0\.ffn_down\.weight", "q3_k", 1, {"q3_k": 1}),
        (r"blk\.1\.attn_q\.weight", "q4_k", 1, {"q5_0": 1}),
        ("ffn_up", "q5_1", 30, {"q5_1": 30}),
    ]
    assert r"blk\.1\.attn_q\.weight=q4_k: 1 tensor(s) written as 1 q5_0 (not q4_k: llama.cpp's fallback" in p.stderr
    assert "ffn_up=q5_1: 30 tensor(s) written as 30 q5_1\n" in p.stderr and "note:" not in p.stderr
    # The same lines build the same bytes, and llama.cpp runs the result.
    digests = {hashlib.sha256((d / f).read_bytes()).hexdigest() for f in ("mix.gguf", "again.gguf")}
    assert len(digests) == 1
    ppl = run_cli("ppl", "-m", d / "mix.gguf", "-f", WIKI, "-c", 128, "--chunks", 1)
    assert "Final estimate: PPL = " in ppl.stderr


def test_a_line_on_a_tensor_a_mix_counts_is_noted_and_moves_the_mix(q4_1_gguf, requant, tmp_path):
    """Q4_K_M gives more bits to every few ffn_down tensors, counted in order: setting the first
    one moves which later ones get them, as the note says (llama.cpp's Q4_K_M is the reference)."""
    line = r"blk\.0\.ffn_down\.weight=q3_k"
    p = run_cli("quantize", q4_1_gguf, tmp_path / "m.gguf", "Q4_K_M", "--tensor-type", line)
    assert "note: Q4_K_M gives more bits to every few attn_v and ffn_down tensors" in p.stderr
    assert "(blk.0.ffn_down.weight)" in p.stderr
    got, plain = _tensors(tmp_path / "m.gguf"), _tensors(requant("Q4_K_M"))
    moved = sorted(n for n in got if n != "blk.0.ffn_down.weight" and got[n][0] != plain[n][0])
    print("moved by the line:", moved)
    assert moved and all(".ffn_down." in n for n in moved)


@pytest.mark.quick
@pytest.mark.parametrize(
    "line, words",
    [
        ("=q8_0", ["expected PATTERN=TYPE"]),
        ("ffn_up", ["expected PATTERN=TYPE"]),
        ("blk[=q8_0", ["is not a regular expression"]),
        ("ffn_up=q9_9", ["unknown ggml type 'q9_9'"]),
        ("ffn_upp=q8_0", ["matches no tensor of"]),
    ],
)
def test_a_bad_line_is_one_line_naming_it_and_nothing_is_written(q4_1_gguf, tmp_path, line, words):
    from kldtool.errors import UsageError

    (tmp_path / "t.txt").write_text(f"# first\n\n{line}\n")
    p = fail("quantize", q4_1_gguf, tmp_path / "out.gguf", "Q8_0", "--tensor-type-file", tmp_path / "t.txt")
    one_line_error(p, UsageError, f"{tmp_path / 't.txt'}:3: ", *words)
    assert not list(tmp_path.glob("out.gguf*"))


@pytest.mark.quick
def test_the_first_part_of_a_split_model_stands_for_every_part(tmp_path):
    """llama.cpp reads a split model from its first part's name; so do the lines' checks."""
    from gguf import GGUFWriter

    from kldtool.engines.llamacpp.tensor_types import tensor_type_names

    for i, name in enumerate(("blk.0.ffn_up.weight", "blk.1.ffn_up.weight"), 1):
        w = GGUFWriter(str(tmp_path / f"m-{i:05d}-of-00002.gguf"), "llama")
        w.add_tensor(name, np.zeros((4, 32), np.float32))
        w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file()
        w.close()
    first = str(tmp_path / "m-00001-of-00002.gguf")
    assert tensor_type_names(first) == {"blk.0.ffn_up.weight": "f32", "blk.1.ffn_up.weight": "f32"}
    assert tensor_type_names(str(tmp_path / "m-00002-of-00002.gguf")) == {"blk.1.ffn_up.weight": "f32"}


@pytest.mark.quick
def test_a_file_over_a_mebibyte_is_refused_before_it_is_parsed(q4_1_gguf, tmp_path):
    from kldtool.errors import UsageError

    (tmp_path / "big.txt").write_text("#" * (1 << 20) + "\nffn_up=q8_0\n")
    p = fail("quantize", q4_1_gguf, tmp_path / "out.gguf", "Q8_0", "--tensor-type-file", tmp_path / "big.txt")
    one_line_error(p, UsageError, "big.txt: over 1 MiB")
    assert not list(tmp_path.glob("out.gguf*"))
