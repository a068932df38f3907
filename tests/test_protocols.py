"""Scoring protocols end to end on SmolLM2 (transformers engine): which positions each one
scores, against hand-written lists, and its perplexity against a direct float64 computation.

A pretokenized corpus (``--corpus-format ids``) fixes the token stream exactly, so small N,
L and S are spelled out by hand; the scored positions are read back from the base file's
window table and from compare's per-token records.
"""

import json
import re

import h5py
import numpy as np
import pytest
import torch

from conftest import WIKI, run_cli
from kldtool.logitsfile import open_base_file

N_STREAM = 11

# Stream offsets of the tokens each window predicts (the scored targets), written out from
# each protocol's definition for a stream of 11 tokens (ids 0..10 differ only in value).
EXPECTED = {
    # chunks [0,4) [4,8): offsets 2..2 score -> targets 3 and 7
    ("llamacpp", "-c", "4"): [[3], [7]],
    # windows [0,4) [2,6) [4,8) [6,10) (whole windows only), every position
    ("exl3", "-c", "4", "--stride", "2"): [[1, 2, 3], [3, 4, 5], [5, 6, 7], [7, 8, 9]],
    # Hugging Face: [0,4)->1,2,3  [3,7)->4,5,6  [6,10)->7,8,9  [9,11)->10, each token once
    ("stride", "-c", "4", "--stride", "3"): [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]],
    # L=5, S=2: [0,5)->1..4  [2,7)->5,6  [4,9)->7,8  [6,11)->9,10
    ("stride", "-c", "5", "--stride", "2"): [[1, 2, 3, 4], [5, 6], [7, 8], [9, 10]],
}


@pytest.fixture(scope="module")
def id_corpus(tmp_path_factory, fp32_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(fp32_dir)
    ids = tok("The history of the city begins with a small settlement by the river")["input_ids"][:N_STREAM]
    assert len(ids) == N_STREAM
    path = tmp_path_factory.mktemp("ids") / "stream.ids"
    path.write_text(" ".join(map(str, ids)) + "\n")
    return path, np.array(ids)


def _scored(base_path) -> list[list[int]]:
    r = open_base_file(base_path)
    try:
        if r.header.windows is None:
            n, first = r.header.n_ctx, r.header.first
            return [list(range(c * n + first + 1, (c + 1) * n)) for c in range(r.header.n_chunk)]
        return [list(range(s + f + 1, s + f + 1 + k)) for s, _, f, k in r.header.windows]
    finally:
        r.close()


@pytest.mark.parametrize("flags", list(EXPECTED), ids=lambda f: "-".join(f))
def test_protocol_scores_the_positions_its_definition_says(flags, id_corpus, fp32_dir, tmp_path):
    corpus, ids = id_corpus
    base = tmp_path / "base.kldt"
    run_cli(
        "base",
        "--engine",
        "transformers",
        "-m",
        fp32_dir,
        "-f",
        corpus,
        "--corpus-format",
        "ids",
        "--protocol",
        *flags,
        "--kl-divergence-base",
        base,
        "--json",
        tmp_path / "b.json",
    )
    assert _scored(base) == EXPECTED[flags]
    # compare's per-token records name the same positions and targets
    run_cli(
        "compare",
        "--engine",
        "transformers",
        "-m",
        fp32_dir,
        "--kl-divergence-base",
        base,
        "--per-token",
        tmp_path / "t.h5",
        "--json",
        tmp_path / "c.json",
    )
    with h5py.File(tmp_path / "t.h5") as f:
        pos = f["position"][:]
        assert pos.tolist() == [p for w in EXPECTED[flags] for p in w]
        assert (f["target"][:] == ids[pos]).all()
    c = json.loads((tmp_path / "c.json").read_text())
    assert c["protocol"]["name"] == flags[0]
    assert c["scored_tokens"] == sum(map(len, EXPECTED[flags]))
    assert c["statistics"]["kld_mean"]["value"] < 1e-4  # the model against its own base


# 4 documents of 3, 5, 9 and 1 tokens
DOCS = [[10, 11, 12], [20, 21, 22, 23, 24], [30, 31, 32, 33, 34, 35, 36, 37, 38], [40]]


def _docs_base(fp32_dir, tmp_path, *protocol):
    """A base file of DOCS (an ids corpus) written with ``--protocol PROTOCOL...``."""
    corpus = tmp_path / "docs.ids"
    corpus.write_text("\n".join(" ".join(map(str, d)) for d in DOCS) + "\n")
    base = tmp_path / "base.kldt"
    run_cli(
        "base",
        "--engine",
        "transformers",
        "-m",
        fp32_dir,
        "-f",
        corpus,
        "--corpus-format",
        "ids",
        "--protocol",
        *protocol,
        "--kl-divergence-base",
        base,
    )
    return base


@pytest.mark.parametrize("full_only", [False, True])
@pytest.mark.quick
def test_documents_scores_each_document_from_its_start(fp32_dir, tmp_path, full_only):
    # Lengths 4 and 8: the 3- and 1-token documents are shorter than 4. By default every document
    # of 2 tokens or more counts whole up to 8 (the 1-token one has nothing to score); with
    # --full-length-only the 5-token one is cut to 4, the 9-token one to 8, the others skipped.
    flags = ["--full-length-only"] if full_only else []
    r = open_base_file(_docs_base(fp32_dir, tmp_path, "documents", "--lengths", "8,4", *flags))
    meta = r.metadata["protocol"]
    if full_only:
        assert r.tokens.tolist() == [20, 21, 22, 23, 30, 31, 32, 33, 34, 35, 36, 37]
        assert r.header.windows == ((0, 4, 0, 3), (4, 8, 0, 7))
        per_length = {"4": {"used": 2, "shorter": 2, "skipped": 2}, "8": {"used": 1, "shorter": 3, "skipped": 3}}
    else:
        assert r.tokens.tolist() == [10, 11, 12, 20, 21, 22, 23, 24, 30, 31, 32, 33, 34, 35, 36, 37]
        assert r.header.windows == ((0, 3, 0, 2), (3, 5, 0, 4), (8, 8, 0, 7))
        per_length = {"4": {"used": 3, "shorter": 2, "skipped": 1}, "8": {"used": 3, "shorter": 3, "skipped": 1}}
    r.close()
    assert meta["shorter_documents"] == ("skipped" if full_only else "counted")
    assert meta["documents"] == {"total": 4, "per_length": per_length}


def test_rolling_scores_every_token_of_every_document_once(fp32_dir, tmp_path):
    # DOCS behind prefix 7, windows of 4 (lm-eval's layout, which
    # tests/test_rolling_protocol.py checks against lm-eval itself).
    docs = DOCS
    base = _docs_base(fp32_dir, tmp_path, "rolling", "-c", 4, "--prefix-token", 7)
    r = open_base_file(base)
    stream = r.tokens.tolist()
    assert stream == [t for d in docs for t in [7, *d]]
    assert r.header.windows == (
        (0, 3, 0, 3),
        (4, 4, 0, 4),
        (5, 4, 3, 1),
        (10, 4, 0, 4),
        (14, 4, 0, 4),
        (15, 4, 3, 1),
        (20, 1, 0, 1),
    )
    r.close()
    run_cli(
        "compare",
        "--engine",
        "transformers",
        "-m",
        fp32_dir,
        "--kl-divergence-base",
        base,
        "--per-token",
        tmp_path / "t.h5",
        "--json",
        tmp_path / "c.json",
    )
    with h5py.File(tmp_path / "t.h5") as f:
        assert f["position"][:].tolist() == [i for i, t in enumerate(stream) if t != 7]  # each once
        assert f["target"][:].tolist() == [t for d in docs for t in d]
    c = json.loads((tmp_path / "c.json").read_text())
    assert c["statistics"]["kld_mean"]["value"] < 1e-4


def _direct_nll(model, ids: np.ndarray) -> np.ndarray:
    """float64 NLL of ids[1:] given their prefix, one window, no batching."""
    with torch.inference_mode():
        logits = model(torch.from_numpy(ids[None].astype(np.int64))).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return -logp[torch.arange(len(ids) - 1), torch.from_numpy(ids[1:].astype(np.int64))].numpy()


@pytest.fixture(scope="module")
def hf_model(fp32_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(fp32_dir), AutoModelForCausalLM.from_pretrained(fp32_dir).eval()


def test_exl3_ppl_is_the_mean_over_every_window_position(hf_model, fp32_dir, tmp_path):
    tok, model = hf_model
    text = WIKI.read_bytes()[:6000]
    (tmp_path / "t.txt").write_bytes(text)
    out = tmp_path / "p.json"
    run_cli(
        "ppl",
        "--engine",
        "transformers",
        "-m",
        fp32_dir,
        "-f",
        tmp_path / "t.txt",
        "--protocol",
        "exl3",
        "-c",
        "256",
        "--stride",
        "64",
        "--chunks",
        "6",
        "--json",
        out,
    )
    r = json.loads(out.read_text())
    ids = np.array(tok(text.rstrip(b"\n").decode())["input_ids"])
    # The seeds' formula, window by window: exp(-mean(all logprobs)), over windows that overlap by 3/4.
    logprobs = np.concatenate([-_direct_nll(model, ids[a : a + 256]) for a in range(0, 6 * 64, 64)])
    assert r["scored_tokens"] == len(logprobs) == 6 * 255
    assert r["ppl"] == pytest.approx(np.exp(-logprobs.mean()), rel=2e-6)
    assert r["protocol"] == {"name": "exl3", "n_ctx": 256, "stride": 64, "bos_id": None, "windows": 6}


def _paragraphs(text: str, n: int) -> list[str]:
    """``n`` paragraphs of over 300 characters: WikiText-2 holds one a line; a text wrapped at a
    width (a clone's stand-in, the pydoc topics) holds them between blank lines."""
    lines = [p.strip() for p in text.split("\n") if len(p.strip()) > 300]
    blocks = [" ".join(b.split()) for b in re.split(r"\n\s*\n", text)]
    return (lines if len(lines) >= n else [b for b in blocks if len(b) > 300])[:n]


def test_documents_ppl_per_length_equals_direct_computation(hf_model, fp32_dir, tmp_path):
    tok, model = hf_model
    paragraphs = _paragraphs(WIKI.read_text(), 12)
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "body": p}) + "\n" for i, p in enumerate(paragraphs)))
    out = tmp_path / "d.json"
    p = run_cli(
        "ppl",
        "--engine",
        "transformers",
        "-m",
        fp32_dir,
        "-f",
        corpus,
        "--text-field",
        "body",
        "--protocol",
        "documents",
        "--lengths",
        "64,128,256",
        "--json",
        out,
        "--plot",
        tmp_path / "len.png",
    )
    r = json.loads(out.read_text())
    docs = [np.array(tok(d)["input_ids"]) for d in paragraphs]
    assert len(r["per_length"]) == 3
    # One pass per document at the longest length: a causal model's first n-1 NLLs are those of
    # its first n tokens alone.
    longest = max(x["length"] for x in r["per_length"])
    whole = [_direct_nll(model, d[:longest]) for d in docs]
    for row in r["per_length"]:
        n = row["length"]
        # A document shorter than n counts with all its tokens (the default; --full-length-only skips it).
        used = [d[:n] for d in docs]
        nll = np.concatenate([w[: len(u) - 1] for w, u in zip(whole, used)])
        assert row["documents_used"] == len(docs) and row["documents_shorter"] == sum(len(d) < n for d in docs)
        assert row["tokens"] == len(nll) == sum(len(u) - 1 for u in used)
        assert row["ppl"] == pytest.approx(np.exp(nll.mean()), rel=2e-6)
        assert f"length {n:6d}: PPL = {row['ppl']:.4f}" in p.stderr
    assert r["per_length"][-1]["documents_shorter"] >= 5
    from PIL import Image

    with Image.open(tmp_path / "len.png") as img:  # the PPL-vs-length plot is a real picture
        assert img.size[0] >= 600 and img.size[1] >= 400
        assert len(np.unique(np.asarray(img.convert("L")))) > 20


def test_stride_reports_bits_per_byte_and_word_perplexity(fp32_dir, tmp_path):
    text = WIKI.read_bytes()[:6000]
    (tmp_path / "t.txt").write_bytes(text)
    out = tmp_path / "s.json"
    run_cli(
        "ppl",
        "--engine",
        "transformers",
        "-m",
        fp32_dir,
        "-f",
        tmp_path / "t.txt",
        "--protocol",
        "stride",
        "-c",
        "512",
        "--stride",
        "256",
        "--json",
        out,
    )
    r = json.loads(out.read_text())
    body = text.rstrip(b"\n")
    words = len(__import__("re").split(r"\s+", body.decode()))
    t = r["text"]
    assert t["bytes"] == len(body) and t["words"] == words
    assert t["bits_per_byte"] == pytest.approx(r["nll_sum"] / len(body) / np.log(2), rel=1e-12)
    assert t["word_perplexity"] == pytest.approx(np.exp(r["nll_sum"] / words), rel=1e-12)
    assert r["ln_ppl"] == pytest.approx(r["nll_sum"] / r["scored_tokens"])


def test_long_windows_run_block_wise_with_the_same_numbers(fp32_dir, tmp_path):
    """-b smaller than the window: the transformers engine carries a KV cache across blocks."""
    text = WIKI.read_bytes()[:8000]
    (tmp_path / "t.txt").write_bytes(text)
    got = {}
    for b in ("1024", "96"):
        out = tmp_path / f"b{b}.json"
        run_cli(
            "ppl",
            "--engine",
            "transformers",
            "-m",
            fp32_dir,
            "-f",
            tmp_path / "t.txt",
            "--protocol",
            "exl3",
            "-c",
            "512",
            "--stride",
            "512",
            "--chunks",
            "2",
            "-b",
            b,
            "--json",
            out,
        )
        got[b] = json.loads(out.read_text())
    assert got["96"]["scored_tokens"] == got["1024"]["scored_tokens"] == 2 * 511
    assert got["96"]["ppl"] == pytest.approx(got["1024"]["ppl"], rel=1e-5)


def test_compare_refuses_flags_that_contradict_the_base_file(fp32_dir, id_corpus, tmp_path):
    corpus, _ = id_corpus
    base = tmp_path / "base.kldt"
    run_cli(
        "base",
        "--engine",
        "transformers",
        "-m",
        fp32_dir,
        "-f",
        corpus,
        "--corpus-format",
        "ids",
        "--protocol",
        "exl3",
        "-c",
        "4",
        "--stride",
        "2",
        "--kl-divergence-base",
        base,
    )
    for flags, said in (
        (("--protocol", "stride"), "--protocol stride contradicts"),
        (("-c", "8"), "-c 8 contradicts"),
        (("--stride", "3"), "--stride 3 contradicts"),
        (("--lengths", "64"), "--lengths 64 contradicts"),
    ):
        p = run_cli(
            "compare", "--engine", "transformers", "-m", fp32_dir, "--kl-divergence-base", base, *flags, check_rc=2
        )
        assert said in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = run_cli(
        "base",
        "--engine",
        "transformers",
        "-m",
        fp32_dir,
        "-f",
        corpus,
        "--corpus-format",
        "ids",
        "--protocol",
        "exl3",
        "-c",
        "4",
        "--format",
        "llamacpp",
        "--kl-divergence-base",
        tmp_path / "x.kld",
        check_rc=2,
    )
    assert "--format llamacpp holds only" in p.stderr and not (tmp_path / "x.kld").exists()
