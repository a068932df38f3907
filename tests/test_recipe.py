"""`kldtool recipe` on a tiny Llama (tests/helpers/vocab_models.py's llama3-32k: two layers,
16 quantizable tensors) at two types, Q4_0 and Q8_0. The references are outside the code under
test: every choice of one candidate per tensor enumerated in numpy (2^16 of them) for the least
summed cost under the size; a float64 forward of the model with one tensor taken from llama.cpp's
build, scored against the base file's rows decoded by hand, for a cost; the GGUF as the gguf
package reads it, and llama.cpp's own rebuild from the written tensor-type file."""

import hashlib
import itertools
import json
import shutil

import numpy as np
import pytest
import torch

from conftest import run_cli
from kldtool import errors
from kldtool.errors import UsageError
from test_attribute import _base_logprobs, _mean_kld, _windows
from test_cli_errors import fail, one_line_error

NAME = "llama3-32k"
TYPES = "Q4_0,Q8_0"
COST_WINDOWS = 2  # test_attribute's decoders read the first two windows
MIX = "Q4_K_M"  # --proof's mix: llama.cpp's own rules on the same source


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from helpers.vocab_gguf import gguf_of
    from helpers.vocab_models import corpus_flags, model_dir

    d = tmp_path_factory.mktemp("recipe")
    src = gguf_of(NAME, "F32")
    base = d / "base.raw"  # llama.cpp's format: the test decodes its rows itself
    run_cli("base", "--engine", "transformers", "-m", model_dir(NAME), *corpus_flags(NAME), "-c", 128, "--chunks",
            4, "--format", "llamacpp", "--kl-divergence-base", base)  # fmt: skip
    bpw = 6.0
    p = run_cli("recipe", src, "--kl-divergence-base", base, "--types", TYPES, "--bpw", bpw, "-o", d / "out",
                "--cost-windows", COST_WINDOWS, "--proof", MIX, "--progress", "none")  # fmt: skip
    return src, base, d, p, bpw


def _build(out, name: str):
    """A build of the run's source: kept under builds/ in a directory of that source's own."""
    (found,) = (out / "builds").glob(f"*/{name}")
    return found


def _costs(out) -> list[dict]:
    return json.loads((out / "costs.json").read_text())["costs"]


def _enumerated(rows: list[dict], r: dict, limit: int) -> tuple[float, float]:
    """(the least summed cost of any choice under ``limit``, every one enumerated in numpy;
    the summed cost of the recipe ``r``'s choice), both from the measured costs in ``rows``."""
    tensors = list(dict.fromkeys(x["tensor"] for x in rows))
    by = {t: [x for x in rows if x["tensor"] == t] for t in tensors}
    assert len(tensors) == 16 and all(len(v) == 2 for v in by.values())
    chosen = {t: next(x for x in by[t] if x["written"] == r["types"][t]) for t in tensors}
    fixed = r["size"] - sum(x["bytes"] for x in chosen.values())
    size = np.array([[x["bytes"] for x in by[t]] for t in tensors])
    cost = np.array([[max(0.0, x["kld_above_base"]) for x in by[t]] for t in tensors])
    combos = np.array(list(itertools.product((0, 1), repeat=16)))
    total_size = fixed + size[np.arange(16), combos].sum(axis=1)
    total_cost = cost[np.arange(16), combos].sum(axis=1)
    return total_cost[total_size <= limit].min(), sum(max(0.0, x["kld_above_base"]) for x in chosen.values())


def test_the_recipe_is_the_least_cost_choice_and_its_file_holds_it(tiny):
    from gguf import GGUFReader

    src, base, d, p, bpw = tiny
    out = d / "out"
    r = json.loads((out / "recipe.json").read_text())
    n_params = sum(int(t.n_elements) for t in GGUFReader(str(src)).tensors)
    limit = int(bpw * n_params / 8)
    assert r["target"] == {"kind": "size", "value": float(limit)} and r["reachable"]
    assert (out / "recipe.gguf").stat().st_size <= limit
    # Every choice enumerated: none fits the size at a lower summed cost (beyond the gap rounding allows).
    rows = _costs(out)
    best, ours = _enumerated(rows, r, limit)
    assert ours <= best + r["gap"] + 1e-12 and r["size"] <= limit
    tensors = list(dict.fromkeys(x["tensor"] for x in rows))
    # The prediction stated with its rounds, within 10 % of the measured KLD at the end.
    assert abs(r["predicted_kld"] - r["measured_kld"]) <= 0.10 * r["measured_kld"]
    assert r["cost_windows"] == [0, 1] and r["held_out_windows"] == [2, 3]
    assert f"mean KLD {r['measured_kld']:.6f} measured on the cost windows" in p.stdout
    # The file holds the chosen types, and its tensor-type file rebuilds it byte for byte
    # through llama-quantize's own path (tt_overrides).
    written = {t.name: t.tensor_type.name.lower() for t in GGUFReader(str(out / "recipe.gguf")).tensors}
    assert {t: written[t] for t in tensors} == r["types"]
    assert {"q4_0", "q8_0"} <= set(r["types"].values())
    again = d / "again.gguf"
    run_cli("quantize", src, again, r["default_type"], "--pure", "--tensor-type-file", out / "recipe.tensor-types.txt")
    digest = {hashlib.sha256(f.read_bytes()).hexdigest() for f in (out / "recipe.gguf", again)}
    assert len(digest) == 1
    frontier = json.loads((out / "frontier.json").read_text())["frontier"]
    sizes = [q["bytes"] for q in frontier]
    assert (
        all(a < b for a, b in zip(sizes, sizes[1:]))
        and len(frontier) > 5
        and (out / "frontier.png").stat().st_size > 10_000
    )
    assert all(q["lower_bound"] <= q["predicted_additive"] + 1e-12 for q in frontier)


def test_the_proof_is_llamacpp_on_the_held_out_windows_and_diff_of_the_pair(tiny, tmp_path):
    """--proof's numbers are what `compare` (llama.cpp) gives each GGUF on the windows the choice
    never saw and what `diff` gives the pair; the mix's point on the plot is the mix's float64
    forward on the cost windows against the stored rows decoded by hand."""
    src, base, d, p, _ = tiny
    out = d / "out"
    r = json.loads((out / "recipe.json").read_text())
    proof, mix = r["proof"], _build(out, f"mix-{MIX}.gguf")
    assert proof["windows"] == [2, 3] and [m["mix"] for m in proof["mixes"]] == [MIX]
    held = ("--chunk-range", "2:4", "--progress", "none")
    runs = {}
    for name, gguf in (("recipe", out / "recipe.gguf"), ("mix", mix)):
        run_cli("compare", "-m", gguf, "--kl-divergence-base", base, *held, "--per-token", tmp_path / f"{name}.h5",
                "--json", tmp_path / f"{name}.json")  # fmt: skip
        runs[name] = json.loads((tmp_path / f"{name}.json").read_text())["statistics"]["kld_mean"]["value"]
    run_cli("diff", tmp_path / "recipe.h5", tmp_path / "mix.h5", "--json", tmp_path / "diff.json")
    k = json.loads((tmp_path / "diff.json").read_text())["measures"]["kld_mean"]
    m = proof["mixes"][0]
    print(proof)
    assert proof["recipe"]["kld"] == pytest.approx(runs["recipe"], rel=1e-9)
    assert m["kld"] == pytest.approx(runs["mix"], rel=1e-9) and m["bytes"] == mix.stat().st_size
    assert m["recipe_minus_mix"] == pytest.approx(k["difference"], rel=1e-9)
    assert m["interval_95"] == pytest.approx(k["interval_95"], rel=1e-9)
    low, high = m["interval_95"]
    verdict = "lower" if high < 0 else "higher" if low > 0 else "not different"
    assert m["recipe_is"] == verdict and f"the recipe is {verdict}" in p.stdout.splitlines()[-1]
    from transformers import AutoModelForCausalLM

    whole = AutoModelForCausalLM.from_pretrained(str(mix.parent), gguf_file=mix.name, dtype=torch.float64).eval()
    above = _mean_kld(whole, _windows(base), _base_logprobs(base))
    point = r["mixes_on_cost_windows"][0]
    print("the mix on the cost windows", point, "float64", above)
    assert point["bytes"] == m["bytes"] and abs(point["kld"] - above) <= 1e-3 * above + 5e-8


def test_a_gguf_whose_tokenizer_transformers_cannot_build_is_one_line(tiny):
    """The tiny model's GGUF vocabulary is not one transformers rebuilds (the tokenizers library
    raises a bare Exception): compare through transformers says so in one line."""
    src, base, _, _, _ = tiny
    p = fail("compare", "--engine", "transformers", "-m", src, "--kl-divergence-base", base)
    one_line_error(p, errors.EngineError, "could not build its tokenizer")


def test_proof_refuses_an_unknown_mix_before_any_cost(tiny, tmp_path):
    src, base, _, _, _ = tiny
    p = fail("recipe", src, "--kl-divergence-base", base, "--types", TYPES, "--size", "1GB", "-o", tmp_path / "o",
             "--proof", "Q4_K_M,Q9_Z")  # fmt: skip
    one_line_error(p, UsageError, "--proof", "'Q9_Z'")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("tensor", ["blk.1.ffn_down.weight", "token_embd.weight"])
def test_a_cost_is_a_float64_leave_one_in_forward(tiny, tensor):
    """The layer-1 tensor's forward started at layer 1 on stored inputs; the embedding's ran whole."""
    from transformers import AutoModelForCausalLM

    src, base, d, _, _ = tiny
    row = next(x for x in _costs(d / "out") if x["tensor"] == tensor and x["asked"] == "Q4_0")
    build = _build(d / "out", "pure-Q4_0.gguf")
    model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float64).eval()
    quant = AutoModelForCausalLM.from_pretrained(str(build.parent), gguf_file=build.name, dtype=torch.float64)
    windows, rows = _windows(base), _base_logprobs(base)
    floor = _mean_kld(model, windows, rows)
    name = {
        "blk.1.ffn_down.weight": "model.layers.1.mlp.down_proj.weight",
        "token_embd.weight": "model.embed_tokens.weight",
    }
    with torch.no_grad():
        model.get_parameter(name[tensor]).copy_(quant.get_parameter(name[tensor]))
    above = _mean_kld(model, windows, rows) - floor
    print(tensor, "cost", row["kld_above_base"], "float64", above)
    # The cost comes from float32 forwards: 1.4e-8 apart on 1.7e-5 measured on a Xeon (2026-12-06),
    # 2e-9 on the embedding's 2.3e-4; the bound leaves float32's noise room on another CPU.
    assert above > 0 and abs(row["kld_above_base"] - above) <= 1e-3 * above + 5e-8


def test_a_kld_target_gives_the_smallest_recipe_under_it_or_names_the_best(tiny):
    src, base, d, _, _ = tiny
    first = json.loads((d / "out" / "recipe.json").read_text())
    cache = d / "out" / "costs-cache.jsonl"
    target = 1.2 * first["measured_kld"]
    common = ("--kl-divergence-base", base, "--types", TYPES, "--cost-windows", COST_WINDOWS, "--cost-cache", cache,
              "--progress", "none")  # fmt: skip
    p = run_cli("recipe", src, *common, "--target-kld", target, "-o", d / "kld")
    assert "0 candidates to measure" in p.stderr  # every cost came from the cache
    r = json.loads((d / "kld" / "recipe.json").read_text())
    assert r["reachable"] and r["measured_kld"] <= target
    # Smallest: the frontier's next smaller answer is predicted (corrected) above the target.
    frontier = json.loads((d / "kld" / "frontier.json").read_text())["frontier"]
    smaller = [q for q in frontier if q["bytes"] < r["size"]]
    assert not smaller or smaller[-1]["predicted"] > target or r["rounds"][-1]["measured"] <= target
    q = fail("recipe", src, *common, "--target-kld", 1e-9, "-o", d / "none")
    msg = one_line_error(q, UsageError, "--target-kld 1e-09: unreachable with Q4_0, Q8_0", "the best found measures")
    assert str(d / "none" / "recipe.gguf") in msg


def test_a_damaged_cost_cache_is_refused_in_one_line_and_a_cut_last_line_is_measured_again(tiny):
    src, base, d, _, _ = tiny
    flags = ("--kl-divergence-base", base, "--types", TYPES, "--cost-windows", COST_WINDOWS, "--size", "10MB")
    lines = (d / "out" / "costs-cache.jsonl").read_bytes().splitlines(keepends=True)
    cut = d / "cut.jsonl"  # a kill during the last record's write
    cut.write_bytes(b"".join(lines[:-1]) + lines[-1][:40])
    p = run_cli("recipe", src, *flags, "--cost-cache", cut, "-o", d / "cut", "--progress", "none")
    assert "1 candidates to measure" in p.stderr and cut.read_bytes().count(b"\n") == len(lines)
    bad = d / "bad.jsonl"
    edited = lines[3].replace(b'"above_base": ', b'"above_base": 1')
    bad.write_bytes(b"".join(lines[:3]) + edited + b"".join(lines[4:]))
    q = fail("recipe", src, *flags, "--cost-cache", bad, "-o", d / "bad")
    one_line_error(q, UsageError, f"{bad}:4: a damaged cost record")
    other = d / "other.jsonl"
    other.write_bytes(lines[0].replace(b'"dtype": "float32"', b'"dtype": "bfloat16"') + b"".join(lines[1:]))
    q = fail("recipe", src, *flags, "--cost-cache", other, "-o", d / "other")
    one_line_error(q, UsageError, f"{other}: costs measured against another source")
    shutil.rmtree(d / "cut")


def test_another_source_in_the_same_directory_gets_builds_of_its_own(tiny, tmp_path):
    """A second source sent to the same -o (its builds/ kept) is built anew: its --pure Q4_0 is
    what llama-quantize makes of it, byte for byte, and the first source's is left as it was."""
    src, base, d, _, _ = tiny
    other, out = tmp_path / "other.gguf", tmp_path / "out"
    shutil.copy(_build(d / "out", f"mix-{MIX}.gguf"), other)  # a quant as the source
    shutil.copytree(d / "out" / "builds", out / "builds")
    first = _build(d / "out", "pure-Q4_0.gguf").read_bytes()
    run_cli("recipe", other, "--kl-divergence-base", base, "--types", TYPES, "--size", "10MB", "-o", out,
            "--cost-windows", COST_WINDOWS, "--rounds", 1, "--progress", "none")  # fmt: skip
    fresh = tmp_path / "fresh.gguf"
    run_cli("quantize", other, fresh, "Q4_0", "--pure")
    builds = {p.read_bytes() for p in (out / "builds").glob("*/pure-Q4_0.gguf")}
    assert builds == {first, fresh.read_bytes()} and first != fresh.read_bytes()


def test_prune_measures_fewer_and_picks_what_measuring_every_candidate_picks(tiny):
    """--prune on a cache of its own: fewer forwards than candidates; every chosen candidate
    measured (with the exhaustive run's cost); the choice as good as the best of every choice
    enumerated over the exhaustive run's costs; each candidate's weight error what gguf's own
    dequantization gives in float64."""
    import gguf
    from gguf import GGUFReader

    src, base, d, _, bpw = tiny
    out = d / "pruned"
    p = run_cli("recipe", src, "--kl-divergence-base", base, "--types", TYPES, "--bpw", bpw, "-o", out,
                "--cost-windows", COST_WINDOWS, "--prune", "--progress", "none")  # fmt: skip
    assert "16 coarsest candidates to measure" in p.stderr
    full = {(x["tensor"], x["asked"]): x for x in _costs(d / "out")}
    rows, r = _costs(out), json.loads((out / "recipe.json").read_text())
    measured = [x for x in rows if x["measured"]]
    print(f"{len(measured)} of {len(rows)} measured; took {r['costs_took']}")
    assert len(measured) < len(rows) == len(full) and r["costs_took"]["forwards"] == len(measured)
    for x in measured:
        assert x["kld_above_base"] == full[(x["tensor"], x["asked"])]["kld_above_base"]
    assert all(
        next(x for x in rows if x["tensor"] == t and x["written"] == w)["measured"] for t, w in r["types"].items()
    )
    limit = int(bpw * sum(int(t.n_elements) for t in GGUFReader(str(src)).tensors) / 8)
    best, _ = _enumerated(list(full.values()), r, limit)
    truth = sum(max(0.0, full[(x["tensor"], x["asked"])]["kld_above_base"]) for x in rows
                if r["types"][x["tensor"]] == x["written"])  # fmt: skip
    assert truth <= best + r["gap"] + 1e-12 and r["size"] <= limit
    assert all(q["estimated_candidates"] >= 0 for q in json.loads((out / "frontier.json").read_text())["frontier"])
    source = {t.name: t for t in GGUFReader(str(src)).tensors}
    for asked in TYPES.split(","):
        build = {t.name: t for t in GGUFReader(str(_build(out, f"pure-{asked}.gguf"))).tensors}
        for x in (x for x in rows if x["asked"] == asked):
            a, b = (gguf.quants.dequantize(t.data, t.tensor_type) for t in (build[x["tensor"]], source[x["tensor"]]))
            want = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).sum())
            assert x["weight_error"] == pytest.approx(want, rel=1e-6), x


def test_report_of_recipes_shows_their_own_numbers_and_draws_the_frontier(tiny, tmp_path):
    """`report OUT/recipe.json`: the table, the rounds and the proof's rows are the file's own
    numbers, in the console, the Markdown and a self-contained page whose inlined PNG is a real
    drawing; a file edited to disagree with itself is refused in one line before anything is
    written."""
    import base64
    import io
    import re

    from matplotlib import image

    _, _, d, _, _ = tiny
    path = d / "out" / "recipe.json"
    r = json.loads(path.read_text())
    again = tmp_path / "again"
    again.mkdir()
    shutil.copy(path, again / "recipe.json")  # two recipes of one cost run: one frontier, both built points
    md, page = tmp_path / "r.md", tmp_path / "r.html"
    p = run_cli("report", path, again / "recipe.json", "--markdown", md, "--html", page, "--title", "tiny recipes")
    m = r["proof"]["mixes"][0]
    html = page.read_text()
    for text in (p.stdout, md.read_text(), html):
        for needle in (f"{r['measured_kld']:.6f}", f"{r['size']:,}", f"{m['recipe_minus_mix']:+.6f}", m["mix"],
                       f"{m['kld']:.6f}", f"{r['proof']['recipe']['kld']:.6f}", m["recipe_is"]):  # fmt: skip
            assert needle in text, (needle, text[:2000])
    assert all(f"{q['measured']:.6f}" in html and f"{q['predicted']:.6f}" in html for q in r["rounds"])
    assert "<script" not in html and "https://" not in html and "http://" not in html and "tiny recipes" in html
    (data,) = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    pixels = image.imread(io.BytesIO(base64.b64decode(data)), format="png")
    assert pixels.shape[0] >= 300 and len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50

    def edited(name: str, change) -> str:
        x = json.loads(path.read_text())
        change(x)
        (tmp_path / name).mkdir()
        (tmp_path / name / "recipe.json").write_text(json.dumps(x))
        return tmp_path / name / "recipe.json"

    flipped = "higher" if m["recipe_is"] != "higher" else "lower"
    cases = [
        (edited("verdict", lambda x: x["proof"]["mixes"][0].update(recipe_is=flipped)),
         f"proof.mixes[0].recipe_is is '{flipped}', but its interval says '{m['recipe_is']}'"),
        (edited("order", lambda x: x["frontier"].reverse()), "frontier[1].bytes is"),
        (edited("nan", lambda x: x.update(measured_kld=float("nan"))), "recipe.measured_kld is nan"),
        (edited("shrunk", lambda x: x["rounds"][0].update(size=-5)), "rounds[0].size is -5"),
    ]  # fmt: skip
    out = tmp_path / "never.md"
    for bad, needle in cases:
        one_line_error(fail("report", bad, "--markdown", out), UsageError, str(bad), needle)
    other = edited("source", lambda x: x.update(source="/elsewhere/model.gguf"))
    one_line_error(fail("report", path, other, "--markdown", out), UsageError, "its source differs from")
    one_line_error(fail("report", path, d / "out" / "costs.json"), UsageError, "costs.json: not a recipe result")
    assert not out.exists()


@pytest.mark.quick
def test_recipe_flag_errors(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    base = ("--kl-divergence-base", tmp_path / "b.kldt", "-o", tmp_path / "o")
    cases = [
        (("recipe", tmp_path / "none.gguf", *base, "--size", "1MB"), "none.gguf: no such GGUF file"),
        (("recipe", gguf, "-o", tmp_path / "o", "--size", "1MB"), "recipe needs --kl-divergence-base"),
        (("recipe", gguf, *base), "give exactly one of --size, --bpw and --target-kld"),
        (("recipe", gguf, *base, "--size", "1MB", "--target-kld", 0.1), "give exactly one of"),
        (("recipe", gguf, *base, "--size", "12 parsecs"), "--size '12 parsecs': expected a number of bytes"),
        (("recipe", gguf, *base, "--target-kld", -1), "--target-kld -1.0: expected a mean KLD above 0"),
        (("recipe", gguf, *base, "--size", "1MB", "--types", "Q4_0,q4_0"), "distinct llama.cpp types"),
        (("recipe", gguf, *base, "--size", "1MB", "--cost-windows", 1), "--cost-windows 1: at least 2"),
    ]
    for args, needle in cases:
        one_line_error(fail(*args), UsageError, needle)
