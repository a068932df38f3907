"""MoE routing (issue 67): the experts transformers' routers chose, stored by ``base`` and compared
by ``compare``, on tiny Qwen 3 MoE and DeepSeek V3 shapes (helpers/moe_models.py). The stored ids
are checked against a float64 computation of each router from its own input; a model against
itself flips nothing; a copy whose layer-L experts were perturbed flips nothing up to L and
flips every layer after it; the KLD split adds up to the run's mean KLD."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import WIKI, compare_json, run_cli
from helpers import moe_models
from helpers.vocab_gguf import write_gguf
from helpers.cpu_kernels import float32_rows_depend_on_the_batch
from kldtool import errors

CTX, CHUNKS = 128, 6
PERTURBED = {"qwen3-moe": 1, "deepseek-v3": 2}  # a routed layer with routed layers after it


BUILT: dict = {}


@pytest.fixture(scope="module", params=sorted(moe_models.SHAPES))
def moe(request, tmp_path_factory):
    """(name, model directory, its base file, the corpus, a scratch directory)."""
    return built(request.param, tmp_path_factory)


def built(name: str, tmp_path_factory):
    if name in BUILT:
        return BUILT[name]
    root = tmp_path_factory.mktemp(name)
    model = moe_models.build(name, root / "model")
    text = moe_models.corpus(root / "corpus.txt")
    base = root / "base.kld"
    args = ("-m", model, "--engine", "transformers", "-f", text, "-c", CTX, "--chunks", CHUNKS)
    run_cli("base", *args, "--save-all-logits", base)
    BUILT[name] = name, model, base, text, root
    return BUILT[name]


def reference_choice(module, hidden: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(expert ids as sets' sorted arrays, the margin between the k-th and (k+1)-th choice
    score) of a router, from its input in float64: softmax (monotone in the logits) or
    DeepSeek's sigmoid plus correction bias (one group)."""
    logits = hidden.double() @ module.weight.detach().double().T
    if hasattr(module, "e_score_correction_bias"):
        choice = torch.sigmoid(logits) + module.e_score_correction_bias.detach().double()
    else:
        choice = logits
    top = torch.topk(choice, module.top_k + 1, dim=-1)
    ids = np.sort(top.indices[:, : module.top_k].numpy(), axis=-1)
    margin = (top.values[:, module.top_k - 1] - top.values[:, module.top_k]).numpy()
    return ids, margin


def test_stored_ids_equal_a_float64_reference_of_the_routers(moe):
    from transformers import AutoModelForCausalLM

    from kldtool.engines.transformers.routing import find_routers
    from kldtool.logitsfile import open_base_file
    from kldtool.routing.section import RoutingReader

    name, model_dir, base, _, _ = moe
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    routers = find_routers(model)
    inputs = {}
    hooks = [
        m.register_forward_pre_hook(lambda m, a, j=j: inputs.__setitem__(j, a[0])) for j, (_, m) in enumerate(routers)
    ]
    reader = open_base_file(str(base))
    try:
        stored = RoutingReader(reader)
        assert stored.shape.layers == tuple(layer for layer, _ in routers)
        assert stored.shape.scoring == ("sigmoid" if name == "deepseek-v3" else "softmax")
        checked = near_ties = 0
        for c in range(reader.header.n_chunk):
            tokens = torch.from_numpy(reader.tokens[c * CTX : (c + 1) * CTX].astype(np.int64))[None]
            with torch.inference_mode():
                model(input_ids=tokens, use_cache=False)
            got = stored.chunk(c)
            first = CTX // 2  # llama-perplexity's scored half
            for j, (_, module) in enumerate(routers):
                hidden = inputs[j].reshape(-1, model.config.hidden_size)[first : first + len(got)]
                ids, margin = reference_choice(module, hidden)
                clear = margin > 1e-6  # float32's own rounding decides a closer call
                near_ties += int((~clear).sum())
                assert (np.sort(got.ids[:, j], axis=-1)[clear] == ids[clear]).all(), (name, c, j)
                checked += int(clear.sum())
        assert checked >= 0.99 * reader.header.scored_tokens * len(routers) and near_ties <= checked // 100
    finally:
        reader.close()
        for h in hooks:
            h.remove()


def test_a_model_against_itself_flips_nothing(moe):
    name, model_dir, base, _, root = moe
    result = compare_json(base, root, "-m", model_dir, "--engine", "transformers")
    routing = result["statistics"]["routing"]
    assert routing["positions"] == result["scored_tokens"] == CHUNKS * (CTX // 2 - 1)
    assert all(row["flip_share"] == 0 and row["mean_overlap"] == 1 for row in routing["layers"])
    assert all(row["router_kl"] < 1e-6 for row in routing["layers"])  # float16's rounding of the stored side
    assert routing["first_departing_layer"]["none"] == routing["positions"]
    assert routing["kld_split"]["changed"]["tokens"] == 0


def test_perturbed_experts_flip_only_the_layers_after_them(moe):
    name, model_dir, base, _, root = moe
    layer = PERTURBED[name]
    quant = moe_models.perturbed_experts(model_dir, root / f"experts-{layer}", layer)
    result = compare_json(base, root, "-m", quant, "--engine", "transformers")
    routing = result["statistics"]["routing"]
    rows = {row["layer"]: row for row in routing["layers"]}
    assert all(rows[x]["flip_share"] == 0 for x in rows if x <= layer)
    assert all(rows[x]["flip_share"] > 0 and rows[x]["mean_overlap"] < 1 for x in rows if x > layer)
    first = routing["first_departing_layer"]
    assert all(first[str(x)] == 0 for x in rows if x <= layer) and first[str(layer + 1)] > 0

    # The split adds up to the run's tokens and mean KLD.
    split, n = routing["kld_split"], result["scored_tokens"]
    assert split["changed"]["tokens"] + split["unchanged"]["tokens"] == n
    total = split["changed"]["kld_sum"] + split["unchanged"]["kld_sum"]
    mean = result["statistics"]["kld_mean"]["value"]
    assert abs(total / n - mean) <= 1e-12 * abs(mean)
    assert abs(split["changed"]["kld_share"] + split["unchanged"]["kld_share"] - 1) < 1e-12
    lo, hi = split["changed"]["interval_95"]
    assert lo <= split["changed"]["kld_mean"] <= hi


def test_info_and_the_flags_that_turn_routing_off(moe):
    name, model_dir, base, text, root = moe
    info = json.loads(run_cli("info", base, "--json").stdout)
    shape = info["metadata"]["routing"]
    assert info["routing_bytes_per_token"] == len(shape["layers"]) * 2 * (1 + 2)  # k ids of u8, k float16
    args = ("-m", model_dir, "--engine", "transformers", "-f", text, "-c", CTX, "--chunks", 2)
    plain = root / "plain.kld"
    run_cli("base", *args, "--no-routing", "--save-all-logits", plain)
    assert "routing" not in json.loads(run_cli("info", plain, "--json").stdout)["metadata"]
    p = run_cli("base", *args, "--routing", "--format", "llamacpp", "--save-all-logits", root / "r.bin", check_rc=2)
    assert "no room for routing" in p.stderr and not (root / "r.bin").exists()
    # A base file without routing: compare says nothing of routing.
    assert "routing" not in compare_json(plain, root, "-m", model_dir, "--engine", "transformers")["statistics"]


def test_llamacpp_f32_routes_as_transformers_does(moe):
    """llama.cpp's own routers (its graph's expert ids, caught by the eval callback) on the F32
    GGUF of the same weights choose the experts transformers chose, at every position and layer."""
    name, model_dir, base, _, root = moe
    gguf = write_gguf(model_dir, root / "model-F32.gguf", "F32")
    routing = compare_json(base, root, "-m", gguf, "--engine", "llamacpp")["statistics"]["routing"]
    assert routing["positions"] == CHUNKS * (CTX // 2 - 1)
    assert all(row["flip_share"] == 0 for row in routing["layers"])
    assert all(row["router_kl"] < 1e-6 for row in routing["layers"])

    # The perturbed copy's flips start after its perturbed layer in llama.cpp too.
    layer = PERTURBED[name]
    quant = write_gguf(moe_models.perturbed_experts(model_dir, root / "p", layer), root / "p-F32.gguf", "F32")
    rows = compare_json(base, root, "-m", quant, "--engine", "llamacpp")["statistics"]["routing"]["layers"]
    assert all((row["flip_share"] == 0) == (row["layer"] <= layer) for row in rows)


def test_coarser_quant_types_flip_more_positions(tmp_path_factory):
    """Qwen 3 MoE quantized by llama.cpp: Q8_0 changes the routing of fewer positions than
    Q4_K_M, which changes fewer than Q2_K."""
    name, model_dir, base, _, root = built("qwen3-moe", tmp_path_factory)
    f32 = write_gguf(model_dir, root / "ladder-F32.gguf", "F32")
    changed = []
    for kind in ("Q8_0", "Q4_K_M", "Q2_K"):
        run_cli("quantize", f32, root / f"{kind}.gguf", kind)
        routing = compare_json(base, root, "-m", root / f"{kind}.gguf", "--engine", "llamacpp")["statistics"]["routing"]
        changed.append(routing["kld_split"]["changed"]["tokens"])
    assert 0 < changed[0] < changed[1] < changed[2], changed


def test_per_token_columns_worst_and_report(moe):
    """The per-token file's routing columns agree with the run's summary, `worst --by routing`
    lists the earliest departures first, and `report` draws and tabulates the flips."""
    import h5py

    name, model_dir, base, _, root = moe
    layer = PERTURBED[name]
    quant = root / f"experts-{layer}"
    if not quant.exists():
        moe_models.perturbed_experts(model_dir, quant, layer)
    h5 = root / "tokens.h5"
    result = compare_json(base, root, "-m", quant, "--engine", "transformers", "--per-token", h5)
    routing = result["statistics"]["routing"]
    layers = [row["layer"] for row in routing["layers"]]
    with h5py.File(h5) as f:
        first = f["routing_first"][:]
        flips = np.unpackbits(f["routing_flips"][:], axis=1, count=len(layers)).astype(bool)
        assert json.loads(f.attrs["routing_layers"]) == layers
    n = routing["positions"]
    assert len(first) == n and {int(x) for x in first} - {-1} <= set(layers)
    for j, row in enumerate(routing["layers"]):
        assert flips[:, j].sum() == round(row["flip_share"] * n)
        assert (first == row["layer"]).sum() == routing["first_departing_layer"][str(row["layer"])]
    departed = np.where(flips.any(axis=1), np.array(layers)[flips.argmax(axis=1)], -1)
    assert (departed == first).all()

    out = root / "worst.json"
    run_cli("worst", h5, "--by", "routing", "-n", 10, "--json", out)
    rows = json.loads(out.read_text())["rows"]
    assert [r["first_departing_layer"] for r in rows] == sorted(r["first_departing_layer"] for r in rows)
    assert rows[0]["first_departing_layer"] == min(set(first) - {-1})

    md, plots = root / "report.md", root / "plots"
    run_cli("report", root / "compare-0.json", "--markdown", md, "--plots", plots)
    assert "### MoE routing" in md.read_text() and (plots / "routing_flips.png").stat().st_size > 10_000


def test_llamacpp_base_stores_what_transformers_routes(moe, tmp_path):
    """A base file written by llama.cpp from the F32 GGUF records the routing transformers then
    reproduces: compared with the transformers model, nothing flips."""
    name, model_dir, _, _, root = moe
    gguf = write_gguf(model_dir, tmp_path / "model-F32.gguf", "F32")
    ids = moe_models.corpus(tmp_path / "corpus.ids", ids=True)
    base = tmp_path / "llamacpp.kldt"
    run_cli(
        "base", "-m", gguf, "-f", ids, "--corpus-format", "ids", "-c", CTX, "--chunks", 3, "--save-all-logits", base
    )
    routing = compare_json(base, tmp_path, "-m", model_dir, "--engine", "transformers")["statistics"]["routing"]
    assert routing["positions"] == 3 * (CTX // 2 - 1)
    assert all(row["flip_share"] == 0 for row in routing["layers"])


def test_convert_keeps_routing_in_the_container_only(moe, tmp_path):
    name, model_dir, base, _, _ = moe
    framed, raw = tmp_path / "framed.kldt", tmp_path / "raw.bin"
    run_cli("convert", base, framed, "--to", "kldtool", "--frame-rows", 16)
    run_cli("convert", base, raw, "--to", "llamacpp")
    assert json.loads(run_cli("info", framed, "--json").stdout)["metadata"]["routing"]["k"] == 2
    args = ("-m", model_dir, "--engine", "transformers")
    a, b = (compare_json(f, tmp_path, *args)["statistics"] for f in (base, framed))
    assert a["routing"] == b["routing"] and "routing" not in compare_json(raw, tmp_path, *args)["statistics"]


BROKEN = {  # how the routing entry is damaged: words the one-line error must hold
    "frame outside the file": (lambda r: r | {"frames": [[10**9, 5]] * len(r["frames"])}, "lies outside"),
    "frames missing": (lambda r: r | {"frames": r["frames"][:-1]}, "frames for"),
    "k above the experts": (lambda r: r | {"k": 99}, "unusable 'routing' metadata"),
    "cut frame": (lambda r: r | {"frames": [[r["frames"][0][0], r["frames"][0][1] - 3]] + r["frames"][1:]}, "chunk 1"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_damaged_routing_entry_is_one_line_and_no_traceback(moe, tmp_path, case):
    from helpers.container_edit import container_tail, with_metadata

    name, model_dir, base, _, _ = moe
    data = base.read_bytes()
    meta = json.loads(container_tail(data)[2])
    change, words = BROKEN[case]
    meta["routing"] = change(meta["routing"])
    bad = tmp_path / "bad.kldt"
    bad.write_bytes(with_metadata(data, json.dumps(meta).encode()))
    p = run_cli("compare", "--kl-divergence-base", bad, "-m", model_dir, "--engine", "transformers", check_rc=None)
    assert p.returncode in (errors.MetadataError.exit_code, errors.CorruptData.exit_code), p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("kldtool: error:") and words in last and "Traceback" not in p.stderr


def test_attribute_by_expert_names_the_damaged_expert(moe):
    """`attribute --granularity expert` on a copy with one expert badly damaged, another barely,
    and a later layer's router (and DeepSeek's shared expert) changed: exactly those units, the
    badly damaged expert first, and keep-lists that name it."""
    name, model_dir, base, _, root = moe
    first = PERTURBED[name]
    noise = {(first, "expert 5"): 0.1, (first, "expert 2"): 0.001, (first + 1, "router"): 0.01}
    if name == "deepseek-v3":
        noise[(first + 1, "shared")] = 0.001
    quant = moe_models.perturbed(model_dir, root / "damaged", noise)
    out, ignore = root / "attribute.json", root / "ignore.txt"
    run_cli(
        "attribute", model_dir, quant, "--kl-divergence-base", base, "--granularity", "expert",
        "--keep", 1, "--ignore-list", ignore, "--json", out,
    )  # fmt: skip
    units = {u["name"]: u for u in json.loads(out.read_text())["units"]}
    expert = f"model.layers.{first}.mlp.experts."
    want = {expert + "5", expert + "2", f"model.layers.{first + 1}.mlp.gate"}
    if name == "deepseek-v3":
        want.add(f"model.layers.{first + 1}.mlp.shared_experts")
    assert set(units) == want
    ranked = json.loads(out.read_text())["units"]
    assert ranked[0]["name"] == expert + "5" and ranked[0]["out"]["gain"] > 0
    assert units[expert + "5"]["in"]["kld_mean"] > 10 * max(units[expert + "2"]["in"]["kld_mean"], 1e-9)
    assert ignore.read_text() == f"re:^model\\.layers\\.{first}\\.mlp\\.experts\\.5\\.\n"


def test_a_run_in_turns_keeps_its_routing_in_the_checkpoint(moe, tmp_path):
    """A compare stopped after 2 windows and resumed from its state file (as a sweep's turns
    are) ends with the routing statistics of one uninterrupted run: the checkpoint keeps each
    window's routing sums."""
    from kldtool.engines.transformers.engine import TransformersEngine
    from kldtool.logitsfile import open_base_file
    from kldtool.pipeline.checkpoints import Checkpoints
    from kldtool.pipeline.compare import run_compare
    from kldtool.pipeline.compare_job import CompareJob
    from kldtool.pipeline.early_stop import Stopping
    from kldtool.pipeline.sinks import Sinks

    name, model_dir, base, _, root = moe
    quant = root / f"experts-{PERTURBED[name]}"
    if not quant.exists():
        moe_models.perturbed_experts(model_dir, quant, PERTURBED[name])
    whole = compare_json(base, tmp_path, "-m", quant, "--engine", "transformers")["statistics"]["routing"]
    quiet = Sinks(out=lambda s: None, info=lambda s: None)
    reader = open_base_file(str(base))
    try:
        for cap in (2, 4, CHUNKS):  # three turns, each a fresh engine resuming the state file
            engine = TransformersEngine(str(quant))
            checkpoints = Checkpoints(str(tmp_path / "q.state"), chunks=1, resume=True)
            job = CompareJob(checkpoints=checkpoints, stopping=Stopping(cap=cap))
            turns = run_compare(engine, reader, job, quiet)["statistics"]["routing"]
            engine.close()
    finally:
        reader.close()
    assert turns["windows"] == CHUNKS and turns["positions"] == whole["positions"]
    assert turns["layers"] == whole["layers"] and turns["first_departing_layer"] == whole["first_departing_layer"]
    assert turns["kld_split"]["changed"]["tokens"] == whole["kld_split"]["changed"]["tokens"]
    # The turns score their windows in other batches than the whole run. Where float32 rows do
    # not depend on the batch (Intel Xeon) the sums are equal to 1e-12; where they do (AMD EPYC
    # Zen 4: 2.1e-6 relative measured) the windows' logits move in their last bits.
    rel = 1e-5 if float32_rows_depend_on_the_batch() else 1e-12
    assert turns["kld_split"]["changed"]["kld_sum"] == pytest.approx(whole["kld_split"]["changed"]["kld_sum"], rel=rel)


@pytest.mark.quick
def test_routing_asked_of_a_dense_model_is_one_line(tmp_path):
    """A dense model (the built-in SmolLM2) has no routers to record: one line, no file."""
    dense = tmp_path / "dense.kldt"
    p = run_cli("base", "--engine", "transformers", "--routing", "-f", WIKI, "-c", CTX, "--chunks", 1,
                "--save-all-logits", dense, check_rc=2)  # fmt: skip
    assert "reads no mixture-of-experts routers" in p.stderr and "Traceback" not in p.stderr and not dense.exists()
