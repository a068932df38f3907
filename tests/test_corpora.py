"""Corpus formats and their errors: JSONL, lines, directories, pretokenized strings and ids."""

import json

import pytest

from conftest import llamacpp_reference, WIKI, run_cli

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def gguf(q4_1_gguf):
    return q4_1_gguf


def _ppl(gguf, tmp_path, *args, **kw):
    return run_cli("ppl", "-m", gguf, "--protocol", "documents", "--json", tmp_path / "r.json", *args, **kw)


@pytest.mark.full_tier
def test_every_document_format_scores_the_same_documents(gguf, tmp_path):
    docs = [
        "The river flows past the old mill and into the sea.",
        "Astronomers observed the comet for three consecutive nights.",
        "A recipe for bread needs flour, water, salt and patience.",
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (tmp_path / "d.txt").write_text("\n".join(docs) + "\n")
    (tmp_path / "dir").mkdir()
    for i, d in enumerate(docs):
        (tmp_path / "dir" / f"{i:02d}.txt").write_text(d + "\n")
    results = {}
    for name, args in (
        ("jsonl", ("-f", tmp_path / "d.jsonl")),
        ("lines", ("-f", tmp_path / "d.txt", "--corpus-format", "lines")),
        ("dir", ("-f", tmp_path / "dir")),
    ):
        _ppl(gguf, tmp_path, *args)
        results[name] = json.loads((tmp_path / "r.json").read_text())
    assert results["jsonl"]["ppl"] == results["lines"]["ppl"] == results["dir"]["ppl"]
    assert results["dir"]["corpus"]["format"] == "dir"
    # Token strings of the model's own vocabulary give the same ids as its tokenizer.
    from kldtool.engines.llamacpp.engine import LlamaCppEngine

    eng = LlamaCppEngine(str(gguf))
    try:
        strings = list(eng.token_strings())
        toks = [" ".join(strings[i].decode() for i in eng.tokenize(d.encode())) for d in docs]
        ids = [" ".join(str(i) for i in eng.tokenize(d.encode())) for d in docs]
    finally:
        eng.close()
    (tmp_path / "d.tok").write_text("\n".join(toks) + "\n")
    (tmp_path / "d.ids").write_text("\n".join(ids) + "\n")
    for fmt in ("tokens", "ids"):
        _ppl(gguf, tmp_path, "-f", tmp_path / f"d.{fmt[:3]}", "--corpus-format", fmt)
        assert json.loads((tmp_path / "r.json").read_text())["ppl"] == results["jsonl"]["ppl"]


@pytest.mark.parametrize(
    "name,content,args,rc,said",
    [
        ("bad.jsonl", '{"text": "fine"}\n{"text": broken\n', (), 5, "line 2 is not JSON"),
        ("field.jsonl", '{"body": "x"}\n', (), 5, "line 1 has no string field 'text'"),
        (
            "bad.tok",
            "Ġthe Ġcat\nĠthe NOT_A_TOKEN_XYZ\n",
            ("--corpus-format", "tokens"),
            5,
            "line 2: token 'NOT_A_TOKEN_XYZ'",
        ),
        ("bad.ids", "1 2 3\n4 x 6\n", ("--corpus-format", "ids"), 5, "line 2: 'x' is not a token id"),
        ("big.ids", "1 2 3\n4 99999999 6\n", ("--corpus-format", "ids"), 5, "document 2: id 99999999 is outside"),
        ("empty.jsonl", "\n\n", (), 31, "no documents"),
        ("x.txt", "a b c\n", ("--corpus-format", "nope"), 2, "--corpus-format 'nope'"),
        ("y.txt", "a b c\n", ("--lengths", "1"), 2, "--lengths 1"),
    ],
)
def test_bad_corpora_get_one_line_errors(gguf, tmp_path, name, content, args, rc, said):
    (tmp_path / name).write_text(content)
    p = _ppl(gguf, tmp_path, "-f", tmp_path / name, *args, check_rc=rc)
    assert said in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.full_tier
def test_ppl_reproduces_llama_perplexity_final_estimate(gguf):
    p = run_cli("ppl", "-m", gguf, "-f", WIKI, "--protocol", "llamacpp", "-c", "128", "--chunks", "8")
    theirs = [l for l in llamacpp_reference("base.txt").read_text().splitlines() if "Final estimate" in l][0]
    ours = [l for l in p.stderr.splitlines() if l.startswith("Final estimate")][0]
    assert ours == theirs[theirs.index("Final estimate") :] == "Final estimate: PPL = 37.7882 +/- 5.89857"


def test_llama_cpp_tokens_are_llama_cpp_pythons_at_any_bytes_per_token(gguf):
    """The engine's one-pass tokenization (a second only where a text averages under two bytes
    a token) against llama-cpp-python's own tokenizer on the same GGUF's vocabulary."""
    from llama_cpp import Llama

    from kldtool.engines.llamacpp.engine import LlamaCppEngine

    ref = Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    engine = LlamaCppEngine(str(gguf))
    try:
        dense = "日本語のテキスト、漢字と仮名。".encode() * 40  # under two bytes a token
        for text in (WIKI.read_bytes()[:200_000], dense, b"x"):
            ours = engine.tokenize(text).tolist()
            assert ours == ref.tokenize(text, add_bos=True, special=False)
        assert len(engine.tokenize(dense)) > len(dense) // 2
    finally:
        engine.close()
