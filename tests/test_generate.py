"""``kldtool generate`` on the built-in model (SmolLM2-135M-Instruct, an instruct model with a chat
template): its corpus is the same for the same seed; the prompts it saw are what transformers'
own ``apply_chat_template`` gives; greedy answers are what transformers' ``generate`` gives; a
base run over the corpus scores exactly the answers' positions (its PPL is a float64 forward's
over those tokens), and compare runs over it; bad input is one line, nothing written."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import run_cli
from kldtool.errors import CorpusError, UsageError
from kldtool.text.prompts import read_prompts

pytestmark = pytest.mark.quick

PROMPTS, SAMPLES, MAX_TOKENS = 4, 2, 24  # over 100 tokens: compare's final statistics need 100
SMALL = ("--num-prompts", PROMPTS, "-n", SAMPLES, "--max-tokens", MAX_TOKENS)
END_OF_TURN = (0, 2)  # SmolLM2's <|endoftext|> and <|im_end|>


def _corpus(path):
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return lines[0], lines[1:]


@pytest.fixture(scope="module")
def tokenizer(fp32_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(fp32_dir)


@pytest.fixture(scope="module")
def llamacpp_corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("generate")
    run_cli("generate", "-o", d / "a.jsonl", *SMALL, "--json", d / "a.json")
    return d, d / "a.jsonl"


@pytest.mark.full_tier
def test_the_same_seed_gives_the_same_corpus_and_another_seed_another(llamacpp_corpus):
    d, first = llamacpp_corpus
    run_cli("generate", "-o", d / "again.jsonl", *SMALL)
    assert (d / "again.jsonl").read_bytes() == first.read_bytes()
    run_cli("generate", "-o", d / "other.jsonl", *SMALL, "--seed", 1)
    (_, a), (_, b) = _corpus(first), _corpus(d / "other.jsonl")
    assert [s["prompt_ids"] for s in a] == [s["prompt_ids"] for s in b]
    assert [s["ids"] for s in a] != [s["ids"] for s in b]
    head, samples = _corpus(first)
    assert head["kldtool"] == "generated" and head["engine"] == "llamacpp"
    settings = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "max_tokens": MAX_TOKENS}
    assert head["sampling"] == settings | {"samples": SAMPLES, "seed": 0}
    assert [(s["prompt"], s["sample"]) for s in samples] == [(i, j) for i in range(PROMPTS) for j in range(SAMPLES)]
    for s in samples:
        ended = s["ids"][-1] in END_OF_TURN
        assert s["finish"] == ("stop" if ended else "length") and len(s["ids"]) <= MAX_TOKENS
        assert ended or len(s["ids"]) == MAX_TOKENS
    figures = json.loads((d / "a.json").read_text())["degeneration"]
    assert figures["samples"] == PROMPTS * SAMPLES and 0 < figures["distinct_2"] <= 1


@pytest.mark.full_tier
def test_a_killed_run_resumes_to_the_corpus_of_an_uninterrupted_one(llamacpp_corpus, tmp_path):
    """generate killed (SIGKILL) after two samples, a torn line left as a crash mid-write leaves
    one: nothing at the corpus's path; without --resume the partial file is refused; with it, the
    run keeps the complete samples and ends with the uninterrupted run's bytes."""
    _, first = llamacpp_corpus
    out, partial = tmp_path / "r.jsonl", tmp_path / "r.jsonl.partial"
    p = subprocess.Popen([sys.executable, "-m", "kldtool", "generate", "-o", str(out), *map(str, SMALL)])
    deadline = time.monotonic() + 120
    while (not partial.exists() or partial.read_bytes().count(b"\n") < 3) and time.monotonic() < deadline:
        assert p.poll() is None, "the run ended before it could be stopped"
        time.sleep(0.01)
    p.kill()
    p.wait()
    assert not out.exists()
    with open(partial, "ab") as f:
        f.write(b'{"prompt":3,"sam')
    refused = run_cli("generate", "-o", out, *SMALL, check_rc=CorpusError.exit_code)
    assert "--resume continues it" in refused.stderr and not out.exists()
    resumed = run_cli("generate", "-o", out, *SMALL, "--resume")
    assert "generate: resuming after" in resumed.stderr
    assert out.read_bytes() == first.read_bytes() and not partial.exists()


@pytest.mark.full_tier
def test_the_prompts_are_the_chat_template_as_transformers_renders_it(llamacpp_corpus, tokenizer):
    """llama.cpp's run renders the GGUF's own template with kldtool's renderer; transformers'
    apply_chat_template of the same messages gives the same ids, on every prompt asked and, for
    the text, on every built-in prompt."""
    from kldtool.engines.transformers.sampling import Sampler
    from types import SimpleNamespace

    _, samples = _corpus(llamacpp_corpus[1])
    prompts = read_prompts(None).items
    for s in samples:
        messages = list(prompts[s["prompt"]].messages)
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert s["prompt_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"]
    ours = Sampler.chat_template(SimpleNamespace(tokenizer=tokenizer, facts=SimpleNamespace(model="smollm2")))
    for p in prompts:
        theirs = tokenizer.apply_chat_template(list(p.messages), add_generation_prompt=True, tokenize=False)
        assert ours.render(list(p.messages), f"line {p.line}") == theirs


@pytest.mark.full_tier
def test_greedy_answers_through_transformers_are_its_own_generate(tmp_path, fp32_dir):
    import torch
    from helpers.greedy_ties import transformers_greedy
    from transformers import AutoModelForCausalLM

    run_cli("generate", "--engine", "transformers", "-o", tmp_path / "g.jsonl", *SMALL, "--temperature", 0)
    head, samples = _corpus(tmp_path / "g.jsonl")
    assert head["engine"] == "transformers"
    model = AutoModelForCausalLM.from_pretrained(fp32_dir, dtype=torch.float32).eval()
    for s in samples[::2]:
        assert s["ids"] == transformers_greedy(model, s["prompt_ids"], MAX_TOKENS)
    assert [s["ids"] for s in samples[::2]] == [s["ids"] for s in samples[1::2]]  # greedy: seeds change nothing


@pytest.mark.full_tier
def test_transformers_samples_the_same_corpus_for_the_same_seed(tmp_path, fp32_dir):
    few = ("--engine", "transformers", "-m", fp32_dir, "--num-prompts", 2, "-n", 2, "--max-tokens", 12)
    run_cli("generate", *few, "-o", tmp_path / "a.jsonl")
    run_cli("generate", *few, "-o", tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    _, samples = _corpus(tmp_path / "a.jsonl")
    assert samples[0]["ids"] != samples[1]["ids"]  # two samples of one prompt, two seeds


@pytest.mark.full_tier
def test_base_scores_the_answers_only_and_compare_runs_over_them(llamacpp_corpus, fp32_dir, requant):
    """transformers' base over the corpus: its PPL is exp of the mean NLL of the answers' tokens
    from a float64 forward of the same model; --score all scores every position; a quant compares."""
    import torch
    from transformers import AutoModelForCausalLM

    d, corpus = llamacpp_corpus
    _, samples = _corpus(corpus)
    common = ("base", "--engine", "transformers", "-m", fp32_dir, "-f", corpus)
    run_cli(*common, "--kl-divergence-base", d / "b.kldt", "--json", d / "b.json")
    got = json.loads((d / "b.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(fp32_dir, dtype=torch.float64).eval()
    nll = []
    for s in samples:
        tokens = torch.tensor([s["prompt_ids"] + s["ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(tokens).logits[0].double(), -1)
        p = len(s["prompt_ids"])
        nll += [-float(logp[p - 1 + k, t]) for k, t in enumerate(s["ids"])]
    assert got["scored_tokens"] == len(nll) == sum(len(s["ids"]) for s in samples)
    assert got["ppl"] == pytest.approx(np.exp(np.mean(nll)), rel=1e-4)
    run_cli(*common, "--score", "all", "--json", d / "all.json")
    every = sum(len(s["prompt_ids"]) + len(s["ids"]) - 1 for s in samples)
    assert json.loads((d / "all.json").read_text())["scored_tokens"] == every
    # compare: depths count from each answer's start; the KLD split by how each answer ended
    bins = ("--depth-bins", "4,8")
    q = run_cli("compare", "-m", requant("Q8_0"), "--kl-divergence-base", d / "b.kldt", *bins, "--json", d / "q.json")
    stats = json.loads((d / "q.json").read_text())["statistics"]
    assert stats["count"] == len(nll) and "KLD by depth (position in the answer)" in q.stdout
    lengths = np.array([len(s["ids"]) for s in samples])
    expected = [
        int(np.clip(lengths, 0, 3).sum()),
        int(np.clip(lengths - 3, 0, 4).sum()),
        int(np.clip(lengths - 7, 0, None).sum()),
    ]
    assert [r["tokens"] for r in stats["depth"]["rows"]] == expected
    by_finish = stats["by_finish"]
    for reason, group in by_finish.items():
        mine = [s for s in samples if s["finish"] == reason]
        assert (group["windows"], group["tokens"]) == (len(mine), sum(len(s["ids"]) for s in mine))
    mean = sum(g["kld_mean"] * g["tokens"] for g in by_finish.values()) / len(nll)
    assert mean == pytest.approx(stats["kld_mean"]["value"], rel=1e-9)
    # in two shards, merged: the same split and the same depths from the answers' starts
    half = len(samples) // 2
    for k, span in enumerate((f"0:{half}", f"{half}:{len(samples)}")):
        shard = ("--chunk-range", span, "--state", d / f"s{k}.npz", *bins)
        run_cli("compare", "-m", requant("Q8_0"), "--kl-divergence-base", d / "b.kldt", *shard)
    m = run_cli("merge", d / "s0.npz", d / "s1.npz", "--json", d / "m.json")
    merged = json.loads((d / "m.json").read_text())["statistics"]
    assert merged["by_finish"].keys() == by_finish.keys() and "Mean KLD by how the answer ended" in m.stdout
    for reason, group in by_finish.items():
        assert merged["by_finish"][reason] == group | {"kld_mean": pytest.approx(group["kld_mean"], rel=1e-12)}
    assert [r["tokens"] for r in merged["depth"]["rows"]] == expected


@pytest.mark.full_tier
def test_report_puts_corpora_side_by_side_and_refuses_answers_to_other_prompts(llamacpp_corpus, tmp_path):
    """report of generated corpora: one row per corpus, its figures from its own samples (counted
    here from the file's lines); a corpus of other settings is refused in one line."""
    d, corpus = llamacpp_corpus
    head, samples = _corpus(corpus)
    answers = [s["ids"] for s in samples]
    bigrams = [tuple(a[i : i + 2]) for a in answers for i in range(len(a) - 1)]
    grams = [[tuple(a[i : i + 4]) for i in range(len(a) - 3)] for a in answers]
    want = [
        str(len(samples)),
        f"{100 * np.mean([s['finish'] == 'length' for s in samples]):.1f}",
        f"{np.mean([len(a) for a in answers]):.1f}",
        f"{len(set(bigrams)) / len(bigrams):.3f}",
        f"{100 * np.mean([1 - len(set(g)) / len(g) for g in grams if g]):.1f}",
    ]
    model = os.path.basename(head["model"]["model"])
    other = tmp_path / "other.jsonl"
    lines = corpus.read_text().splitlines()
    moved = head["chat_template"] | {"from": "another copy of the model's chat template"}  # the same hash
    other.write_text("\n".join([json.dumps(head | {"engine": "elsewhere", "chat_template": moved}), *lines[1:]]) + "\n")
    run_cli("report", corpus, other, "--markdown", tmp_path / "r.md")
    rows = [line.split("|")[1:-1] for line in (tmp_path / "r.md").read_text().splitlines() if line.startswith("| ")]
    assert [c.strip() for c in rows[0]][:4] == ["corpus", "model", "engine", "samples"]
    assert [[c.strip() for c in r] for r in rows[1:]] == [
        [corpus.name, model, "llamacpp", *want],
        [other.name, model, "elsewhere", *want],
    ]
    other.write_text("\n".join([json.dumps(head | {"sampling": head["sampling"] | {"seed": 1}}), *lines[1:]]) + "\n")
    p = run_cli("report", corpus, other, "--markdown", tmp_path / "no.md", check_rc=UsageError.exit_code)
    assert "its header's 'sampling' differs" in p.stderr and not (tmp_path / "no.md").exists()


@pytest.mark.parametrize(
    "case, code, says",
    [
        ("broken", CorpusError.exit_code, "line 2: not JSON"),
        ("empty", CorpusError.exit_code, "line 1: an empty prompt"),
        ("template", UsageError.exit_code, "failed to render it: no system prompts here"),
        ("too_long", UsageError.exit_code, "passes the model's context of 8192"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, case, code, says):
    prompts = tmp_path / "p.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "Hi"}]})
    prompts.write_text(
        {"broken": good + "\n{oops\n", "empty": json.dumps({"prompt": "  "}) + "\n"}.get(case, good + "\n")
    )
    extra = ()
    if case == "template":
        (tmp_path / "t.jinja").write_text("{{ raise_exception('no system prompts here') }}")
        extra = ("--chat-template", tmp_path / "t.jinja")
    if case == "too_long":
        extra = ("--max-tokens", 9000)
    p = run_cli("generate", "--prompts", prompts, "-o", tmp_path / "c.jsonl", *extra, check_rc=code)
    (line,) = p.stderr.strip().splitlines()
    assert says in line and "Traceback" not in p.stderr
    assert sorted(os.listdir(tmp_path)) == sorted(n for n in ("p.jsonl", "t.jinja") if (tmp_path / n).exists())


def test_a_generated_corpus_is_refused_by_a_stream_protocol_and_checked_line_by_line(tmp_path):
    """A corpus as generate writes it (written here by hand: its format is the claim), read by ppl."""
    head = {"kldtool": "generated", "version": 1, "engine": "llamacpp"}
    sample = {"prompt": 0, "sample": 0, "seed": 7, "finish": "length", "prompt_ids": [1, 4093, 198], "ids": [504, 314]}
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps(head) + "\n" + json.dumps(sample) + "\n")
    p = run_cli("ppl", "-f", corpus, "--protocol", "llamacpp", "-c", 16, check_rc=UsageError.exit_code)
    assert "--protocol documents" in p.stderr
    for broken, says in (
        ({"finish": "maybe"}, "line 2: finish must be one of stop, length"),
        ({"ids": [504, -1]}, "line 2: ids must be a list of token ids"),
        ({"prompt_ids": []}, "line 2: prompt_ids must be a list of token ids"),
    ):
        corpus.write_text(json.dumps(head) + "\n" + json.dumps(sample | broken) + "\n")
        p = run_cli("ppl", "-f", corpus, check_rc=CorpusError.exit_code)
        (line,) = p.stderr.strip().splitlines()
        assert says in line


def test_an_engine_that_cannot_sample_and_bad_settings_are_refused_before_a_model_loads(tmp_path):
    factory = ("--engine", "python", "-m", tmp_path / "nowhere.py:make")  # refused before it is looked for
    p = run_cli("generate", *factory, "-o", tmp_path / "c.jsonl", check_rc=UsageError.exit_code)
    assert "the python engine does not sample answers (the transformers, llamacpp and vllm engines do)" in p.stderr
    p = run_cli("generate", "--top-p", 0, "-o", tmp_path / "c.jsonl", check_rc=UsageError.exit_code)
    assert "--top-p 0.0 (0 < p <= 1)" in p.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "ids, finish, says",
    [
        ([1, 2, 49152], "stop", "not ids of the model's 49152-token vocabulary"),
        ([1, -1], "stop", "not ids of the model's"),
        ([1, True], "stop", "not ids of the model's"),
        ("1 2", "stop", "not ids of the model's"),
        ([1] * 5, "length", "5 ids ending by 'length' for --max-tokens 4"),
        ([1, 2], "length", "2 ids ending by 'length'"),
        ([1, 2], "abort", "ending by 'abort'"),
    ],
)
def test_a_served_answer_is_checked_whole(ids, finish, says):
    """A vLLM server's sampled answer comes from another process: refused unless it is ids of
    the vocabulary, no more than asked for, and ends for one of the two reasons."""
    from kldtool.engines.contract import Sampling
    from kldtool.engines.vllm.sampling import checked
    from kldtool.errors import EngineError

    with pytest.raises(EngineError, match=says.replace("(", r"\(")):
        checked(ids, finish, Sampling(max_tokens=4), 49152, "http://127.0.0.1:1: sample 0")
    got, why = checked([5, 49151], "stop", Sampling(max_tokens=4), 49152, "here")
    assert got.tolist() == [5, 49151] and why == "stop"
