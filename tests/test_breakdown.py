"""worst --by depth|kind: a real compare run of the Q2_K requant over a stride base file of the
built-in GGUF (the first window scores from its second token, so every depth bucket is filled),
each bucket's numbers against a float64 numpy computation from the per-token columns."""

import json

import h5py
import numpy as np
import pytest

from conftest import WIKI, run_cli
from kldtool.analysis.breakdown import kind_of

pytestmark = pytest.mark.quick

WIKI_HEAD = 20000


@pytest.fixture(scope="module")
def run(q4_1_gguf, requant, tmp_path_factory):
    d = tmp_path_factory.mktemp("breakdown")
    text = d / "t.txt"
    text.write_bytes(WIKI.read_bytes()[:WIKI_HEAD])
    base = d / "stride.kldt"
    stride = ("--protocol", "stride", "-c", 128, "--stride", 64, "--chunks", 6)
    run_cli("base", "-m", q4_1_gguf, "-f", text, *stride, "--kl-divergence-base", base)
    run_cli("compare", "--kl-divergence-base", base, "-m", requant("Q2_K"), "--per-token", d / "q2.h5")
    with h5py.File(d / "q2.h5", "r") as f:
        cols = {k: f[k][:] for k in ("chunk", "position", "target", "kld", "dp", "same_top")}
    return d, cols


def _expected(cols: dict, mask: np.ndarray) -> dict:
    kld = cols["kld"][mask].astype(np.float64)
    dp = cols["dp"][mask].astype(np.float64)
    return {
        "tokens": int(mask.sum()),
        "kld_mean": kld.sum() / mask.sum(),
        "same_top_p": cols["same_top"][mask].mean(),
        "rms_dp": np.sqrt(np.mean(dp * dp)),
    }


def _check(row: dict, want: dict) -> None:
    assert row["tokens"] == want["tokens"]
    for k in ("kld_mean", "same_top_p"):
        assert row[k] == pytest.approx(want[k], rel=1e-9), k
    assert row["rms_dp"] == pytest.approx(want["rms_dp"], rel=1e-6)  # dp squared in float32, as llama.cpp


@pytest.mark.full_tier
def test_depth_buckets_partition_the_run_and_equal_numpy(run):
    d, cols = run
    run_cli("worst", d / "q2.h5", "--by", "depth", "--json", d / "depth.json")
    out = json.loads((d / "depth.json").read_text())
    # The stride protocol's windows start every 64 tokens; the first scores positions 1..127.
    starts = 64 * cols["chunk"].astype(np.int64)
    depth = cols["position"].astype(np.int64) - starts
    rows = {r["bucket"]: r for r in out["rows"]}
    assert list(rows) == ["1", "2-3", "4-7", "8-15", "16-31", "32-63", "64-127"]
    for label, r in rows.items():
        lo, _, hi = label.partition("-")
        _check(r, _expected(cols, (depth >= int(lo)) & (depth <= int(hi or lo))))
    assert sum(r["tokens"] for r in rows.values()) == len(cols["kld"])
    total = cols["kld"].astype(np.float64).sum()
    assert sum(r["kld_sum"] for r in rows.values()) == pytest.approx(total, rel=1e-12)
    assert "kld_mean_interval_95" in rows["64-127"]  # six windows to resample
    # The 99th percentile as llama.cpp takes it: float32 fraction and interpolation.
    v = np.sort(cols["kld"][depth >= 64])
    x = np.float32(0.99) * np.float32(len(v) - 1)
    t = x - np.float32(int(x))
    assert rows["64-127"]["kld_p99"] == float((np.float32(1) - t) * v[int(x)] + t * v[int(x) + 1])


@pytest.mark.full_tier
def test_kinds_partition_the_run_and_user_classes_count_their_tokens(run):
    d, cols = run
    ids = np.unique(cols["target"])[:40]
    (d / "ids.txt").write_text(" ".join(map(str, ids)))
    run_cli(
        "worst", d / "q2.h5", "--by", "kind", "--class", r"the=^\s*[Tt]he$", "--class", f"some=@{d / 'ids.txt'}",
        "--json", d / "kind.json",
    )  # fmt: skip
    out = json.loads((d / "kind.json").read_text())
    builtin = [r for r in out["rows"] if not r.get("user_class")]
    assert sum(r["tokens"] for r in builtin) == len(cols["kld"])
    assert sum(r["kld_sum"] for r in builtin) == pytest.approx(cols["kld"].astype(np.float64).sum(), rel=1e-12)
    user = {r["bucket"]: r for r in out["rows"] if r.get("user_class")}
    _check(user["some"], _expected(cols, np.isin(cols["target"], ids)))
    assert 0 < user["the"]["tokens"] < len(cols["kld"]) * 0.2


def test_kind_of_token_texts():
    cases = {
        " the": "word start",
        "ing": "word continuation",
        " 1994": "digits",
        "\n": "whitespace",
        " ,": "punctuation",
        " {": "code-like",
        "snake_case": "code-like",
        "camelCase": "code-like",
        " é": "word start",
        "—": "punctuation",
    }
    assert {t: kind_of(t) for t in cases} == cases


@pytest.mark.full_tier
@pytest.mark.parametrize(
    "args, words",
    [
        (("--by", "kind", "--class", "nothing"), "expected NAME=REGEX or NAME=@FILE"),
        (("--by", "kind", "--class", "x=(["), "not a regular expression"),
        (("--by", "kind", "--class", "x=@/no/such/ids"), "cannot read /no/such/ids"),
        (("--by", "kld", "--class", "x=a"), "--class goes with --by kind"),
    ],
)
def test_bad_class_flags_are_one_line_usage_errors(run, args, words):
    d, _ = run
    p = run_cli("worst", d / "q2.h5", *args, check_rc=2)
    (line,) = p.stderr.strip().splitlines()
    assert words in line
