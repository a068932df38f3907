"""Hidden-state base files (`base --store hidden`): the real SmolLM2 through transformers.

The reference is outside the hidden path: the row file the same engine writes (`hf_base`,
`--store logprobs`), read back as llama.cpp's raw layout and by the llama.cpp engine."""

import json
import os
import re

import pytest

from conftest import WIKI, run_cli

RAW_ROW = 98312  # bytes of one llama.cpp row of SmolLM2's 49,152-entry vocabulary


def hidden_base(tmp_path, chunks: int, dtype: str = "float32", *extra):
    out = tmp_path / f"hidden-{dtype}-{chunks}.kldt"
    run_cli(
        "base",
        "--engine",
        "transformers",
        "--dtype",
        dtype,
        "-f",
        WIKI,
        "-c",
        128,
        "--chunks",
        chunks,
        "--store",
        "hidden",
        "--kl-divergence-base",
        out,
        *extra,
    )
    return out


@pytest.fixture(scope="module")
def hidden8(tmp_path_factory):
    return hidden_base(tmp_path_factory.mktemp("hidden"), 8)


def test_a_hidden_file_is_the_row_file_replayed(hidden8, hf_base, tmp_path):
    """fp32: replayed to the bit. Converted to llama.cpp's raw layout it is byte for byte the
    row file's conversion, and a quant's compare prints the same characters against either."""
    raws = []
    for src in (hidden8, hf_base):
        raws.append(tmp_path / f"{src.stem}.bin")
        run_cli("convert", src, raws[-1], "--to", "llamacpp")
    assert raws[0].read_bytes() == raws[1].read_bytes()
    j = tmp_path / "h.json"
    on_hidden = run_cli("compare", "--kl-divergence-base", hidden8, "--json", j)  # the built-in Q4_1 GGUF
    on_rows = run_cli("compare", "--kl-divergence-base", hf_base)
    assert on_hidden.stdout == on_rows.stdout
    floor = json.loads(j.read_text())["replay_floor"]
    assert floor["tokens"] == 2 * 63 and floor["kld_mean"] < 1e-7 and floor["max_abs_dlogit"] == 0.0
    assert "replay floor: mean KLD 0 " in on_hidden.stderr
    info = json.loads(run_cli("info", "--json", hidden8).stdout)
    assert info["store"] == "hidden" and info["hidden"] == "576 x float32"
    assert info["head_bytes"] == 49152 * 576 * 4 and info["replay_floor_kld_mean"] == floor["kld_mean"]
    # A frame of hidden states stands for 32 MiB of replayed rows (a row file's frame: 8 MiB, 85
    # rows), so the host replays a whole c=512 chunk as one product.
    assert info["rows_per_frame"] == (32 << 20) // RAW_ROW


def test_bytes_per_token_and_bf16_replayed_as_computed(hidden8, tmp_path):
    """The per-token part, from two runs of different lengths: under 1/40 of a raw row with
    float32 states, under 1/80 with bf16 ones; the head is the rest. A bf16 model's logits are
    replayed in bf16, as it computed them, not in float32. That is bit-exact only where the CPU's
    bf16 matmul takes one kernel for the forward's batch and for the replay's rows: on an AVX2
    Zen 3 the floor is 0; on an AVX-512/AMX Xeon oneDNN takes another from 353 rows on (the
    forward here: 6 windows of 65), and a rare logit differs by one bf16 step (floor 3e-10)."""
    per_token = {}
    for dtype in ("float32", "bfloat16"):
        long = hidden8 if dtype == "float32" else hidden_base(tmp_path, 6, dtype)
        short = hidden_base(tmp_path, 2, dtype)
        per_token[dtype] = (
            (os.path.getsize(long) - os.path.getsize(short)) / ((8 if dtype == "float32" else 6) - 2) / 63
        )
        info = json.loads(run_cli("info", "--json", long).stdout)
        print(dtype, "replay floor:", info["replay_floor_kld_mean"], "|Δlogit|", info["replay_max_abs_dlogit"])
        if dtype == "float32":
            assert info["replay_floor_kld_mean"] == 0.0
        else:  # 0 on AVX2 Zen 3 and on some Xeons; 3.1e-10 where a rare logit is one bf16 step off
            # (the AMX Xeon of the docstring; 1/8 below a logit of 32, 1/4 below 64)
            assert info["replay_floor_kld_mean"] < 1e-9 and info["replay_max_abs_dlogit"] <= 0.25
    print("bytes per scored token:", per_token, "raw row / them:", {k: RAW_ROW / v for k, v in per_token.items()})
    assert per_token["float32"] <= RAW_ROW / 40 and per_token["bfloat16"] <= RAW_ROW / 80


@pytest.mark.quick
def test_a_replay_above_tolerance_writes_no_file(tmp_path):
    """A float64 reference run is stored at float32, so its replay is close but not exact: a
    tolerance below that floor stops the run, naming the floor, with no file at all."""
    out = tmp_path / "strict.kldt"
    p = run_cli(
        "base",
        "--engine",
        "transformers",
        "--dtype",
        "float64",
        "-f",
        WIKI,
        "-c",
        128,
        "--chunks",
        2,
        "--store",
        "hidden",
        "--replay-tolerance",
        1e-30,
        "--kl-divergence-base",
        out,
        check_rc=60,
    )
    line = p.stderr.strip().splitlines()[-1]
    print(line)
    assert line.endswith("over 126 tokens, above --replay-tolerance 1e-30: no file written")
    floor = float(re.search(r"mean KLD of (\S+) nats", line).group(1))
    dlogit = float(re.search(r"\|Δlogit\| up to (\S+)\)", line).group(1))
    assert 0 < floor < 1e-10 and 0 < dlogit < 1e-4
    assert os.listdir(tmp_path) == []  # neither the file nor a partial for --resume


def test_a_damaged_or_cut_head_is_a_one_line_error(hidden8, tmp_path):
    data = bytearray(hidden8.read_bytes())
    head = json.loads(run_cli("info", "--json", hidden8).stdout)["metadata"]["head"]
    data[head["offset"] + 1000] ^= 0xFF
    bad = tmp_path / "bad-head.kldt"
    bad.write_bytes(bytes(data))
    p = run_cli("compare", "--kl-divergence-base", bad, check_rc=14)
    assert (
        p.stderr.strip().splitlines()[-1].endswith("does not match its sha256 in the metadata (damaged or truncated)")
    )
    cut = tmp_path / "cut.kldt"
    cut.write_bytes(bytes(data[: head["offset"] + 100]))
    p = run_cli("info", cut, check_rc=16)
    assert "incomplete container" in p.stderr
