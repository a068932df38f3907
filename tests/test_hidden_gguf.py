"""Hidden-state base files from llama.cpp (the built-in Q4_1 GGUF, its tied Q8_0 head replayed
as ggml computes it) and from custom python factories, checked against llama-perplexity's own
base file and printed statistics (../shared/fixtures/llamacpp), not against our row files.

The hidden file is the fixture's run: c=128, 8 chunks of wikitext."""

import json
import re

import numpy as np
import pytest

from conftest import llamacpp_reference, ROOT, WIKI, final_block_lines, run_cli
from helpers.claimed import claimed

TINY = ROOT / "tests" / "helpers" / "tiny_lm.py"


def value(text: str, label: str) -> float:
    """The first number after ``label`` in llama-perplexity-style output."""
    return float(re.search(re.escape(label) + r"\s*:\s*(-?[\d.]+)", text).group(1))


@pytest.fixture(scope="module")
def gguf_hidden(tmp_path_factory):
    """(hidden file, the base run's stderr), the llama.cpp codec so the rows are comparable
    code by code with llama-perplexity's."""
    out = tmp_path_factory.mktemp("gguf-hidden") / "q4_1-hidden.kldt"
    p = run_cli(
        "base",
        "-f",
        WIKI,
        "-c",
        128,
        "--chunks",
        8,
        "--store",
        "hidden",
        "--codec",
        "llamacpp",
        "--kl-divergence-base",
        out,
    )
    return out, p.stderr


def test_the_base_run_prints_llama_perplexitys_ppl_and_a_replay_floor_below_1e_10(gguf_hidden):
    path, stderr = gguf_hidden
    ours = [l for l in stderr.splitlines() if l.startswith("Final estimate")]
    theirs = [
        l.split(" I ", 1)[1] for l in llamacpp_reference("base.txt").read_text().splitlines() if "Final estimate" in l
    ]
    assert ours == theirs == ["Final estimate: PPL = 37.7882 +/- 5.89857"]
    info = json.loads(run_cli("info", "--json", path).stdout)
    print("replay floor:", {k: v for k, v in info.items() if k.startswith("replay")})
    assert info["hidden"] == "576 x float32" and info["metadata"]["head"]["dtype"] == "ggml-q8_0"
    assert info["head_bytes"] == 49152 * 576 // 32 * 34  # the GGUF's own Q8_0 blocks
    # measured 3.8e-12 (AVX2 Zen 3) and 4.1e-12 (AVX-512 Xeon), |Δlogit| 4.5e-5
    assert 0 < info["replay_floor_kld_mean"] < claimed("hidden.floor") and info["replay_max_abs_dlogit"] < 1e-3


def test_expanded_to_the_raw_layout_it_is_llama_perplexitys_file_within_one_code(gguf_hidden, fixture_base, tmp_path):
    """`convert --to llamacpp`: the same header and tokens, and per entry the same uint16 code
    as llama-perplexity wrote, or one step away where float32 summation order lands on the
    other side of a rounding boundary."""
    raw = tmp_path / "expanded.kld"
    run_cli("convert", gguf_hidden[0], raw, "--to", "llamacpp")
    ours, theirs = np.fromfile(raw, dtype=np.uint8), np.fromfile(fixture_base, dtype=np.uint8)
    assert len(ours) == len(theirs)
    head = 8 + 12 + 4 * 128 * 8
    assert (ours[:head] == theirs[:head]).all()
    a = ours[head:].view("<u2").reshape(-1, 49156)[:, 4:].astype(np.int32)
    b = theirs[head:].view("<u2").reshape(-1, 49156)[:, 4:].astype(np.int32)
    differ = (a != b).mean()
    print(f"codes that differ: {differ:.4%}, by at most {np.abs(a - b).max()}")
    assert np.abs(a - b).max() <= 1 and differ < 0.01


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K_M", "Q2_K"])
def test_compares_against_it_agree_with_those_against_llama_perplexitys_file(
    gguf_hidden, fixture_base, requant, type_name, tmp_path
):
    """Mean KLD, PPL(Q) and same top print what the compare against llama-perplexity's raw file
    prints (its own printed output where the fixtures hold it). 0.6 % of the stored codes are
    one step apart from llama-perplexity's (float32 summation order), so unrounded the mean KLD
    is within 1e-5 relative of that compare's (measured 2.6e-7 to 2.4e-6) and PPL(base), read
    from the stored targets' codes, within 1e-5 (measured 1.4e-6); PPL(Q) is equal. The replay
    floor is printed."""
    model = requant(type_name)
    printed = llamacpp_reference(f"compare-{type_name}.txt")
    raw = run_cli("compare", "-m", model, "--kl-divergence-base", fixture_base, "--json", tmp_path / "r.json").stdout
    theirs = printed.read_text() if printed.exists() else raw
    p = run_cli("compare", "-m", model, "--kl-divergence-base", gguf_hidden[0], "--json", tmp_path / "h.json")
    ours = p.stdout
    assert "its replay floor: mean KLD" in p.stderr
    h, r = (json.loads((tmp_path / f"{k}.json").read_text()) for k in ("h", "r"))
    assert h["replay_floor"]["kld_mean"] < claimed("hidden.floor")
    for label in ("Mean    KLD", "Mean PPL(Q)", "Same top p"):
        assert value(ours, label) == value(theirs, label), label
    assert value(ours, "Mean PPL(base)") == pytest.approx(value(theirs, "Mean PPL(base)"), rel=1e-5)
    a, b = (x["statistics"]["kld_mean"]["value"] for x in (h, r))
    print(type_name, "mean KLD", a, "vs", b, f"({a / b - 1:.1e} relative)")
    assert abs(a / b - 1) < claimed("hidden.kld")
    assert h["statistics"]["ppl_q"]["value"] == pytest.approx(r["statistics"]["ppl_q"]["value"], rel=1e-12)


def test_an_external_head_compares_like_the_stored_one_and_refuses_another(gguf_hidden, requant, tmp_path):
    """--head external keeps only the GGUF's path and the head's sha256: the file is 30 MB
    smaller, compare prints the same characters, and a model with another head (the F16
    requant's f16 token_embd) is refused with exit 23 before anything runs."""
    ext = tmp_path / "external.kldt"
    run_cli(
        "base",
        "-f",
        WIKI,
        "-c",
        128,
        "--chunks",
        8,
        "--store",
        "hidden",
        "--codec",
        "llamacpp",
        "--head",
        "external",
        "--kl-divergence-base",
        ext,
    )
    inline = gguf_hidden[0]
    saved = inline.stat().st_size - ext.stat().st_size  # the head, give or take the metadata's path text
    assert abs(saved - 49152 * 576 // 32 * 34) < 512, saved
    facts = json.loads(run_cli("info", "--json", ext).stdout)
    assert facts["head_bytes"] == 0 and facts["head"].startswith("ggml-q8_0 [49152, 576], read from /")
    model = requant("Q2_K")
    a = run_cli("compare", "-m", model, "--kl-divergence-base", ext).stdout
    b = run_cli("compare", "-m", model, "--kl-divergence-base", inline).stdout
    assert a.splitlines()[2:] == b.splitlines()[2:]  # all but the line naming the base file
    p = run_cli("compare", "-m", model, "--kl-divergence-base", ext, "--head-from", requant("F16"), check_rc=23)
    line = p.stderr.strip().splitlines()[-1]
    assert "(ggml-f16 [49152, 576]" in line and line.endswith(
        "is not the one this file was written with "
        "(ggml-q8_0 [49152, 576], sha256 "
        f"{json.loads(run_cli('info', '--json', ext).stdout)['metadata']['head']['sha256'][:16]}...)"
    )
    p = run_cli("compare", "-m", model, "--kl-divergence-base", inline, "--head-from", requant("F16"), check_rc=2)
    assert p.stderr.strip().endswith("does not name an external output head")
    p = run_cli(
        "base",
        "-f",
        WIKI,
        "-c",
        128,
        "--chunks",
        1,
        "--head",
        "external",
        "--kl-divergence-base",
        tmp_path / "x.kldt",
        check_rc=2,
    )
    assert p.stderr.strip().endswith("--head external names the output head of a hidden-state file: add --store hidden")


def test_an_f16_gguf_head_replays_with_fp16_activations(requant, tmp_path):
    out = tmp_path / "f16.kldt"
    run_cli(
        "base",
        "-m",
        requant("F16"),
        "-f",
        WIKI,
        "-c",
        128,
        "--chunks",
        2,
        "--store",
        "hidden",
        "--kl-divergence-base",
        out,
    )
    info = json.loads(run_cli("info", "--json", out).stdout)
    print("F16 head replay floor:", info["replay_floor_kld_mean"])
    assert info["metadata"]["head"]["dtype"] == "ggml-f16" and info["head_bytes"] == 49152 * 576 * 2
    assert info["replay_floor_kld_mean"] < 1e-9


@pytest.mark.quick
def test_a_python_factory_with_hidden_and_head(tmp_path):
    """tests/helpers/tiny_lm.py's GRU offers hidden(ids), its Linear head and a logit
    multiplier: its hidden file compares exactly like its row file. A factory without them, and
    a hidden file compared against another vocabulary even with --force, are one-line errors."""
    base = ("base", "--engine", "python", "-m", f"{TINY}:make_base", "-f", WIKI, "-c", 256, "--chunks", 4)
    hidden, rows = tmp_path / "h.kldt", tmp_path / "r.kldt"
    run_cli(*base, "--store", "hidden", "--kl-divergence-base", hidden)
    run_cli(*base, "--kl-divergence-base", rows)
    info = json.loads(run_cli("info", "--json", hidden).stdout)
    assert info["hidden"] == "64 x float32" and info["replay_floor_kld_mean"] < 1e-12
    quant = ("compare", "--engine", "python", "-m", f"{TINY}:make_quant")
    a = run_cli(*quant, "--kl-divergence-base", hidden).stdout
    b = run_cli(*quant, "--kl-divergence-base", rows).stdout
    assert final_block_lines(a) == final_block_lines(b)
    plain = tmp_path / "plain.py"
    plain.write_text(
        f"import sys\nsys.path.insert(0, {str(TINY.parent)!r})\nimport tiny_lm\n\n"
        "class Plain:\n    def __init__(self):\n        m = tiny_lm.make_base()\n"
        "        self.tokenizer, self.logits = m.tokenizer, m.forward\n\n"
        "def make():\n    return Plain()\n"
    )
    p = run_cli(
        "base",
        "--engine",
        "python",
        "-m",
        f"{plain}:make",
        "-f",
        WIKI,
        "-c",
        256,
        "--chunks",
        1,
        "--store",
        "hidden",
        "--kl-divergence-base",
        tmp_path / "x.kldt",
        check_rc=2,
    )
    assert p.stderr.strip().splitlines() == [
        f"kldtool: error: --store hidden: the factory's object of --model "
        f"{plain}:make has no hidden(ids) and head (see --engine python in "
        f"docs/protocols.md); use --store logprobs"
    ]
    assert not (tmp_path / "x.kldt").exists()
    p = run_cli("compare", "--kl-divergence-base", hidden, "--force", check_rc=20)  # SmolLM2's 49,152 vs 256
    assert len(p.stderr.strip().splitlines()) == 1 and "49152" in p.stderr
