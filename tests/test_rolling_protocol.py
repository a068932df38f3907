"""``--protocol rolling`` against lm-evaluation-harness itself (installed from the package
registry into .venv-lmeval, beside kldtool's environment): the window layout of its
``get_rolling_token_windows``/``make_disjoint_window``, and the word perplexity, byte
perplexity and bits per byte its Hugging Face model class and ``wikitext`` task compute on the
built-in SmolLM2 over ten WikiText-2 test articles (c = 256, so most take several windows).

lm-eval runs at float64, so its numbers are the exact values of its definitions: at float32 its
log-softmax sits about 8e-6 nats per token below the exact value (measured: 1.0e-5 in word
perplexity), which would blur a 1e-7 comparison. kldtool runs at float32, as users run it.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, WIKI, compare_json, run_cli, sha256
from helpers.claimed import claimed

from kldtool.text import wikitext
from kldtool.text.protocols import Protocol, rolling_windows
from kldtool.errors import UsageError

# lm-eval's wikitext task pages WikiText-2's own articles.
pytestmark = pytest.mark.long_module
LENGTH = 256
TITLE = re.compile(r"^ = [^=].* = \r?$")  # " = Robert Boulter = ", not " = = Career = = "


def articles() -> list[str]:
    """The test's own paging of the raw text (independent of kldtool.text.wikitext): a new article
    at each top-level title line."""
    out: list[list[str]] = [[]]
    for line in WIKI.read_text(encoding="utf-8").split("\n"):
        if TITLE.match(line):
            out.append([])
        out[-1].append(line)
    return [p for p in ("\n".join(a) for a in out) if p.strip()]


@pytest.fixture(scope="module")
def pages() -> dict[str, list[str]]:
    found = articles()
    by_size = sorted(range(len(found)), key=lambda i: len(found[i]))
    return {
        "wikitext": [found[i] for i in sorted(by_size[:10])],  # the ten shortest, in file order
        "plain": [found[i] for i in sorted(by_size[1:4])],
    }


@pytest.fixture(scope="module")
def lmeval(fp32_dir, pages, tmp_path_factory) -> dict:
    """What lm-eval itself computes for ``pages``. Its float64 run takes minutes on two cores, so
    it is done once per machine and kept in kldtool's cache (as the quantized test checkpoints
    are), under a key of everything it depends on: the pinned lm-eval (its setup script), the
    helper that drives it, the model's weights, the pages and the window length."""
    from kldtool.engines.defaults import cache_dir

    runs = {
        "wikitext": {"pages": pages["wikitext"], "detokenize": True},
        "plain": {"pages": pages["plain"], "detokenize": False},
    }
    helper, setup = ROOT / "tests" / "helpers" / "lmeval_rolling.py", ROOT / "scripts" / "lmeval" / "setup.sh"
    key = hashlib.sha256(
        "\0".join(
            [
                json.dumps(runs, sort_keys=True),
                helper.read_text(),
                setup.read_text(),
                sha256(Path(fp32_dir) / "model.safetensors"),
                str(LENGTH),
                "float64",
            ]
        ).encode()
    )
    kept = cache_dir() / f"lmeval-reference-{key.hexdigest()[:24]}.json"
    if kept.exists():
        return json.loads(kept.read_text())
    py = ROOT / ".venv-lmeval" / "bin" / "python"
    if not py.exists():
        subprocess.run(["bash", str(setup)], check=True)
    d = tmp_path_factory.mktemp("lmeval")
    (d / "runs.json").write_text(json.dumps(runs))
    p = subprocess.run(
        [str(py), str(helper), fp32_dir, str(LENGTH), "float64", str(d / "runs.json"), str(d / "out.json")],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    kept.parent.mkdir(parents=True, exist_ok=True)
    part = kept.with_name(f".{kept.name}.{os.getpid()}")
    os.replace(shutil.copy(d / "out.json", part), kept)  # whole or absent
    return json.loads(kept.read_text())


@pytest.mark.needs_shared
def test_paging_and_detokenizer_are_lmevals(pages, lmeval):
    assert wikitext.pages(WIKI.read_text(encoding="utf-8")) == articles()
    assert len(articles()) == 62
    assert [wikitext.detokenize(p) for p in pages["wikitext"]] == lmeval["runs"]["wikitext"]["texts"]


@pytest.mark.needs_shared
def test_window_layout_is_lmevals(lmeval):
    prefix = lmeval["prefix_token_id"]
    for n, theirs in lmeval["synthetic_layouts"].items():
        doc = np.arange(100, 100 + int(n))
        if not theirs:
            assert int(n) == 0
            continue
        ours = rolling_windows([doc], 8, prefix).windows
        assert len(ours) == len(theirs), n
        for w, (context, continuation) in zip(ours, theirs):
            assert list(w.targets) == continuation  # the same tokens predicted
            assert list(w.tokens) == (context + continuation)[:-1]  # from the same model input
            assert w.first + w.n_scored == len(w.tokens)


@pytest.mark.parametrize("run", ["wikitext", "plain"])
@pytest.mark.needs_shared
def test_ppl_rolling_reproduces_lmeval(fp32_dir, pages, lmeval, run, tmp_path):
    theirs = lmeval["runs"][run]
    if run == "wikitext":
        corpus = tmp_path / "wiki.raw"
        corpus.write_text("\n".join(pages[run]), encoding="utf-8")
        fmt = ("--corpus-format", "wikitext")
    else:
        corpus = tmp_path / "pages.jsonl"
        corpus.write_text("".join(json.dumps({"text": p}) + "\n" for p in pages[run]), encoding="utf-8")
        fmt = ()
    run_cli(
        "ppl", "-m", fp32_dir, "-f", corpus, *fmt, "--protocol", "rolling", "-c", LENGTH, "--json", tmp_path / "r.json"
    )
    ours = json.loads((tmp_path / "r.json").read_text())
    print(run, {k: (ours["text"][k], theirs[k]) for k in ("word_perplexity", "byte_perplexity", "bits_per_byte")})
    assert ours["scored_tokens"] == sum(len(ids) for ids in theirs["ids"])  # every token, once
    # Measured: word perplexity 3.6e-8 apart (wikitext, AVX-512 Xeon; 2e-8 in an earlier run), byte
    # perplexity and bits per byte under 1e-8, the NLL sum about 9e-9: docs/protocols.md states 1e-7.
    assert ours["nll_sum"] == pytest.approx(-sum(theirs["loglikelihoods"]), rel=claimed("rolling.nll_sum"))
    for k in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        assert ours["text"][k] == pytest.approx(theirs[k], rel=claimed("rolling.text")), k
    assert ours["protocol"] | {"prefix_id": lmeval["prefix_token_id"], "n_ctx": LENGTH} == ours["protocol"]


@pytest.mark.needs_shared
def test_compare_over_lmevals_tokens(fp32_dir, q4_1_gguf, pages, lmeval, tmp_path):
    """A rolling base file stores lm-eval's scored tokens; a quant (the built-in Q4_1 GGUF,
    through llama.cpp) is compared over exactly those."""
    corpus = tmp_path / "pages.jsonl"
    corpus.write_text("".join(json.dumps({"text": p}) + "\n" for p in pages["plain"]), encoding="utf-8")
    base = tmp_path / "rolling.kldt"
    run_cli(
        "base",
        "-m",
        fp32_dir,
        "-f",
        corpus,
        "--protocol",
        "rolling",
        "-c",
        LENGTH,
        "--kl-divergence-base",
        base,
        "--json",
        tmp_path / "base.json",
    )
    r = compare_json(base, tmp_path, "-m", q4_1_gguf)
    theirs = lmeval["runs"]["plain"]
    n = sum(len(ids) for ids in theirs["ids"])
    assert r["protocol"]["name"] == "rolling" and r["scored_tokens"] == n
    ppl_base = float(np.exp(-sum(theirs["loglikelihoods"]) / n))
    assert json.loads((tmp_path / "base.json").read_text())["ppl"] == pytest.approx(ppl_base, rel=1e-5)
    # compare's PPL(base) comes from the stored rows, whose log-probs are clamped at -16 nats
    # below each row's top, as llama.cpp's are: a few rare targets read higher.
    assert r["statistics"]["ppl_base"]["value"] == pytest.approx(ppl_base, rel=0.01)
    assert 1e-3 < r["statistics"]["kld_mean"]["value"] < 1.0  # Q4_1 weights against the fp32 model
    info = json.loads(run_cli("info", base, "--json").stdout)
    assert info["protocol"] == "rolling"


@pytest.mark.quick
def test_rolling_flags_refused():
    with pytest.raises(UsageError, match="--stride"):
        Protocol.from_flags("rolling", 256, 64, None)
    with pytest.raises(UsageError, match="--prefix-token"):
        Protocol.from_flags("stride", 256, 64, None, prefix=0)
    with pytest.raises(UsageError, match="--ctx-size 1"):
        Protocol.from_flags("rolling", 1, None, None)
    p = run_cli("ppl", "--protocol", "rolling", "--prefix-token", "999999", "-c", 64, "--chunks", 1, check_rc=None)
    assert p.returncode != 0 and "outside the vocabulary" in p.stderr.strip().splitlines()[-1]
