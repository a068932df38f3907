"""The xLSTM workflow with the real ``xlstm`` package: a helibrunna run of a small random
xLSTMLMModel (tests/helpers/helibrunna_run.py: mLSTM and sLSTM blocks, 4 heads, context 256,
checkpoints saved in the CUDA backend's layout) scored as the music evaluation does it,
against that evaluation written here in plain torch: per song, the first N tokens, songs of
under 2 tokens skipped, inputs tokens[:-1] and targets tokens[1:] in one teacher-forced pass
(the model's parallel forward where the input fits its context, its recurrent step() beyond),
NLL from log_softmax at the targets, [PAD] targets masked, avg_nll = total NLL / scored tokens."""

import json
import math
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, WIKI, run_cli
from helpers.claimed import claimed

sys.path.insert(0, str(ROOT / "tests" / "helpers"))
import helibrunna_run as hb  # noqa: E402

pytestmark = pytest.mark.long_module
# Every length past the context takes the same recurrent path, whatever N: the test runs to 4k
# (the CLI and the reference each step through every token), benchmarks/xlstm_lengths.py to 16k.
LENGTHS = (512, 1024, 2048, 4096)
CONTEXT = 256
SONGS = [1, 50, 180, 700, 1500, 5000]  # a 1-token song, songs shorter than each N, one past 4k
SHORT_SONGS = [1, 50, 180, 300, 1100]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return hb.make_run(tmp_path_factory.mktemp("xlstm") / "musicxlstm")


@pytest.fixture(scope="module")
def models():
    # The reference's token-by-token steps are too small to share out: more threads only spin
    # against the kldtool process beside it.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield hb.reference_models()
    torch.set_num_threads(threads)  # the worker's next module gets its threads back


def _ids(path) -> list[list[int]]:
    vocab = {t: i for i, t in enumerate(hb.vocabulary())}
    return [[vocab[t] for t in line.split()] for line in path.read_text().splitlines() if line.strip()]


_PASSES: dict = {}  # (model, song) -> its pass: the last checkpoint's at 1024 serves two tests


def _song_nll(model, ids: list[int]) -> np.ndarray:
    """The evaluation's teacher-forced pass over one (already truncated) song."""
    key = (id(model), tuple(ids))
    if key not in _PASSES:
        _PASSES[key] = _pass(model, ids)
    return _PASSES[key]


def _pass(model, ids: list[int]) -> np.ndarray:
    x = torch.tensor(ids[:-1])[None]
    with torch.inference_mode():
        if x.shape[1] <= CONTEXT:
            logits = model(x)
        else:
            state, out = None, []
            for t in range(x.shape[1]):
                lg, state = model.step(x[:, t : t + 1], state)
                out.append(lg)
            logits = torch.cat(out, 1)
        logp = torch.log_softmax(logits[0], dim=-1)
        return -logp.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()


def _reference(model, songs: list[list[int]], lengths, full_only=False) -> dict:
    """n -> (avg_nll, scored tokens, songs used, songs skipped). Every song's pass is run once,
    cut at max(lengths): min(lengths) > CONTEXT, so each song takes the same path (forward or
    step) at every N, and the first N-1 NLLs of a causal pass are the N-token pass's."""
    assert min(lengths) > CONTEXT
    pad = hb.vocabulary().index(hb.PAD)
    nll = {i: _song_nll(model, s[: max(lengths)]) for i, s in enumerate(songs) if len(s) >= 2}
    out = {}
    for n in lengths:
        total, count, used = 0.0, 0, 0
        for i, s in enumerate(songs):
            cut = s[:n]
            if len(cut) < 2 or (full_only and len(s) < n):
                continue
            keep = np.array(cut[1:]) != pad
            total += float(nll[i][: len(cut) - 1][keep].astype(np.float64).sum())
            count += int(keep.sum())
            used += 1
        out[n] = (total / count, count, used, len(songs) - used)
    return out


def _check(row: dict, ref: tuple) -> None:
    avg, count, used, skipped = ref
    assert row["total_tokens"] == count and row["num_sequences"] == used and row["skipped_sequences"] == skipped
    assert row["avg_nll"] == pytest.approx(avg, rel=claimed("xlstm.ppl"))
    assert row["perplexity"] == pytest.approx(math.exp(avg), rel=claimed("xlstm.ppl"))


def test_lengths_past_the_context_equal_the_evaluation(run, models, tmp_path):
    songs_file = hb.write_songs(tmp_path / "songs.txt", SONGS)
    out = tmp_path / "r.json"
    p = run_cli(
        "ppl", "-m", run, "-f", songs_file, "--protocol", "documents",
        "--lengths", ",".join(map(str, LENGTHS)), "--json", out, "--plot", tmp_path / "len.png",
    )  # fmt: skip
    r = json.loads(out.read_text())
    assert r["model"]["engine"] == "xlstm" and r["model"]["checkpoint"] == "checkpoint-158760-last"
    assert r["protocol"]["shorter_documents"] == "counted" and r["masked_tokens"] > 0
    ref = _reference(models[hb.STEPS[-1]], _ids(songs_file), LENGTHS)
    for row in r["per_length"]:
        _check(row, ref[row["length"]])
        assert row["max_context"] == row["length"]
    assert "shorter than 4096: counted whole" in p.stderr
    assert (tmp_path / "len.png").stat().st_size > 10_000


def test_full_length_only_counts_only_songs_that_long(run, models, tmp_path):
    songs_file = hb.write_songs(tmp_path / "songs.txt", SHORT_SONGS)
    out = tmp_path / "r.json"
    run_cli(
        "ppl", "-m", run, "-f", songs_file, "--protocol", "documents", "--lengths", "290,1024",
        "--full-length-only", "--json", out,
    )  # fmt: skip
    r = json.loads(out.read_text())
    ref = _reference(models[hb.STEPS[-1]], _ids(songs_file), (290, 1024), full_only=True)
    assert [x["num_sequences"] for x in r["per_length"]] == [2, 1]
    for row in r["per_length"]:
        _check(row, ref[row["length"]])


def test_checkpoint_sweep_equals_the_evaluation_and_resumes(run, models, tmp_path):
    songs_file = hb.write_songs(tmp_path / "songs.txt", SHORT_SONGS)
    args = ["ppl", "-m", run, "--checkpoints", "all", "-f", songs_file, "--protocol", "documents", "--lengths", 1024]
    args += ["-o", tmp_path / "res", "--json", tmp_path / "all.json", "--plot", tmp_path / "plots"]
    p = run_cli(*args)
    runs = json.loads((tmp_path / "all.json").read_text())["runs"]
    assert [x["checkpoint"]["step"] for x in runs] == list(hb.STEPS)
    history = json.loads((run / "history.json").read_text())
    logged = dict(zip(history["step"], history["loss"]))
    songs = _ids(songs_file)
    for x in runs:
        c = x["checkpoint"]
        _check(x["per_length"][0], _reference(models[c["step"]], songs, (1024,))[1024])
        near = min(logged, key=lambda s: (abs(s - c["step"]), s))
        assert (c["loss_step"], c["training_loss"]) == (near, logged[near])
    assert runs[-1]["checkpoint"]["loss_step"] != hb.STEPS[-1]  # the last step is not a logged one
    lines = p.stdout.splitlines()
    lines = lines[next(i for i, ln in enumerate(lines) if ln.startswith("checkpoint ")) :]
    assert lines[0].split() == ["checkpoint", "step", "train", "loss", "PPL@1024"]
    assert lines[5].split()[2].startswith("~")
    for name in ("loss_vs_ppl.png",):
        assert (tmp_path / "plots" / name).stat().st_size > 10_000
    # A rerun scores nothing: every checkpoint's result is kept and the table is the same.
    again = run_cli(*args, "--csv", tmp_path / "t.csv")
    assert again.stderr.count("scored before, kept") == len(hb.STEPS) and "step 20000" not in again.stderr
    assert again.stdout == "\n".join(lines) + "\n"  # no progress lines: only the table
    table = [ln.split(",") for ln in (tmp_path / "t.csv").read_text().splitlines()]
    assert table[0] == ["checkpoint", "step", "training_loss", "loss_step", "ppl_1024"]
    assert [(int(t[1]), float(t[2]), float(t[4])) for t in table[1:]] == [
        (x["checkpoint"]["step"], x["checkpoint"]["training_loss"], x["per_length"][0]["perplexity"]) for x in runs
    ]
    # Two named steps and a glob, in step order.
    chosen = run_cli("ppl", "-m", run, "--checkpoints", "*-last,40000", "-f", songs_file, "--protocol", "documents",
                     "--lengths", 1024, "-o", tmp_path / "res")  # fmt: skip
    rows = [ln.split()[0] for ln in chosen.stdout.splitlines() if ln.startswith("checkpoint-")]
    assert rows == ["checkpoint-40000", "checkpoint-158760-last"]


def test_step_and_parallel_agree_where_both_run(run, tmp_path):
    songs_file = hb.write_songs(tmp_path / "songs.txt", [60, 120, 200, 256])
    got = {}
    for b in (2048, 64):  # -b 64: every window longer than 64 tokens goes through step()
        out = tmp_path / f"b{b}.json"
        run_cli("ppl", "-m", f"{run}/checkpoint-40000", "-f", songs_file, "--protocol", "documents", "-b", b,
                "--json", out)  # fmt: skip
        got[b] = json.loads(out.read_text())
    assert got[2048]["model"]["checkpoint"] == "checkpoint-40000"
    assert got[64]["ppl"] == pytest.approx(got[2048]["ppl"], rel=1e-5)
    assert got[64]["scored_tokens"] == got[2048]["scored_tokens"]


def test_bad_inputs_get_one_line(run, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("s-1 t-2 b-1\ns-1 q-77 b-1\n")
    p = run_cli("ppl", "-m", run, "-f", bad, "--protocol", "documents", check_rc=5)
    assert p.stderr.strip().splitlines()[-1].endswith("line 2: token 'q-77' is not in the model's vocabulary")
    p = run_cli("ppl", "-m", run, "--checkpoints", "99", "-f", bad, "-o", tmp_path / "o", check_rc=2)
    assert "'99' matches no checkpoint" in p.stderr
    p = run_cli("ppl", "-m", run, "--checkpoints", "all", "-f", bad, check_rc=2)
    assert "-o DIR" in p.stderr


@pytest.mark.quick
def test_a_directory_that_is_not_a_helibrunna_run_is_one_line(tmp_path):
    p = run_cli("ppl", "--engine", "xlstm", "-m", tmp_path, "-f", WIKI, "-c", 64, "--chunks", 1, check_rc=6)
    assert p.stderr.strip().splitlines() == [
        f"kldtool: error: {tmp_path}: not a helibrunna run (tokenizer.json and checkpoint-N/config.yaml)"
    ]
