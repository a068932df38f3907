"""`kldtool recipe` on a mixture of experts: the tiny random Qwen 3 MoE of helpers/moe_models.py
as an F32 GGUF, at Q4_0 and Q8_0, and its DeepSeek V3 (llama.cpp's deepseek2, read by
engines/latent_gguf.py, as transformers reads none: latent attention's kv_b_proj split per head
into attn_k_b and attn_v_b, a dense first layer, a shared expert, sigmoid routing). Each layer's stacked routed-expert tensors (gate, up, down)
are candidates of their own, though transformers keeps gate and up in one parameter; the router
stays as llama.cpp keeps it. References outside the code under test: gguf's own reading of the
files, a float64 forward with one expert tensor taken from llama.cpp's build, and the routers'
own logits (transformers' output_router_logits) of the source and of the built recipe."""

import json

import numpy as np
import pytest
import torch

from conftest import run_cli
from helpers import moe_models
from helpers.vocab_gguf import write_gguf
from test_attribute import _base_logprobs, _mean_kld, _windows

COST_WINDOWS = 2  # test_attribute's decoders read the first two windows
# DeepSeek's shape with 32-wide key heads: attn_k_b's rows are the key head (16 in moe_models),
# and Q4_0's blocks take 32, so llama.cpp would keep a narrower one in float.
NOPE = 32


def _model_and_gguf(root):
    model = moe_models.build("qwen3-moe", root / "model")
    return model, write_gguf(model, root / "qwen3-moe-F32.gguf", "F32")


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    d = tmp_path_factory.mktemp("recipe-moe")
    model, src = _model_and_gguf(d)
    text = moe_models.corpus(d / "corpus.txt")
    base = d / "base.raw"  # llama.cpp's format: the test decodes its rows itself
    run_cli("base", "--engine", "transformers", "-m", model, "-f", text, "-c", 128, "--chunks", 4,
            "--format", "llamacpp", "--kl-divergence-base", base)  # fmt: skip
    p = run_cli("recipe", src, "--kl-divergence-base", base, "--types", "Q4_0,Q8_0", "--bpw", 6.5, "-o", d / "out",
                "--cost-windows", COST_WINDOWS, "--progress", "none")  # fmt: skip
    return src, base, d, p


@pytest.mark.quick
def test_stacked_experts_map_to_the_parts_transformers_loads_them_into(tmp_path):
    """expert_slots' parts of gate_up_proj and down_proj hold, in the GGUF transformers loads,
    the very values gguf reads from each llama.cpp tensor."""
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM

    from kldtool.engines.parameter_parts import part_of
    from kldtool.recipe.expert_slots import expert_slots

    _, src = _model_and_gguf(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    slots = expert_slots(model)
    tensors = {t.name: np.asarray(t.data) for t in GGUFReader(str(src)).tensors}
    names = {f"blk.{i}.ffn_{w}_exps.weight" for i in range(moe_models.LAYERS) for w in ("gate", "up", "down")}
    assert set(slots) == names
    for name, (pname, part) in slots.items():
        got = part_of(model.get_parameter(pname).detach(), part).numpy()
        assert np.array_equal(got, tensors[name]), name


def test_experts_are_candidates_and_the_router_stays(moe):
    from gguf import GGUFReader

    src, _, d, p = moe
    r = json.loads((d / "out" / "recipe.json").read_text())
    costs = json.loads((d / "out" / "costs.json").read_text())["costs"]
    tensors = {x["tensor"] for x in costs}
    experts = {f"blk.{i}.ffn_{w}_exps.weight" for i in range(moe_models.LAYERS) for w in ("gate", "up", "down")}
    assert experts <= tensors and not any("ffn_gate_inp" in t for t in tensors)
    written = {t.name: t.tensor_type.name.lower() for t in GGUFReader(str(d / "out" / "recipe.gguf")).tensors}
    assert {t: written[t] for t in r["types"]} == r["types"]
    assert {written[f"blk.{i}.ffn_gate_inp.weight"] for i in range(moe_models.LAYERS)} == {"f32"}
    assert {r["types"][t] for t in experts} == {"q4_0", "q8_0"}, r["types"]  # the choice splits the experts


def test_an_expert_tensors_cost_is_a_float64_leave_one_in_forward(moe):
    """The up projection of layer 1's experts, a part of transformers' gate_up_proj, swapped in
    alone from llama.cpp's Q4_0 build."""
    from transformers import AutoModelForCausalLM

    src, base, d, _ = moe
    tensor = "blk.1.ffn_up_exps.weight"
    costs = json.loads((d / "out" / "costs.json").read_text())["costs"]
    row = next(x for x in costs if x["tensor"] == tensor and x["asked"] == "Q4_0")
    (build,) = (d / "out" / "builds").glob("*/pure-Q4_0.gguf")
    eager = {"dtype": torch.float64, "experts_implementation": "eager"}  # grouped_mm has no float64
    model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, **eager).eval()
    quant = AutoModelForCausalLM.from_pretrained(str(build.parent), gguf_file=build.name, **eager)
    windows, rows = _windows(base), _base_logprobs(base)
    floor = _mean_kld(model, windows, rows)
    name = "model.layers.1.mlp.experts.gate_up_proj"
    half = model.get_parameter(name).shape[1] // 2
    with torch.no_grad():
        model.get_parameter(name)[:, half:].copy_(quant.get_parameter(name)[:, half:])
    above = _mean_kld(model, windows, rows) - floor
    print(tensor, "cost", row["kld_above_base"], "float64", above)
    assert above > 0 and abs(row["kld_above_base"] - above) <= 1e-3 * above + 5e-8


def _chosen(path, windows: np.ndarray) -> np.ndarray:
    """Routed layers x tokens x k: each router's top k by its own logits, sorted."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    k = model.config.num_experts_per_tok
    with torch.inference_mode():
        out = model(input_ids=torch.from_numpy(windows.astype(np.int64)), output_router_logits=True, use_cache=False)
    return np.stack([np.sort(torch.topk(lg.float(), k, dim=-1).indices.numpy(), axis=-1) for lg in out.router_logits])


def test_the_built_recipes_routing_flips_are_the_routers_own(moe):
    """Flips against the source's choice, recomputed from the router logits transformers returns
    for the source's GGUF and the recipe's, loaded as files."""
    src, base, d, p = moe
    r = json.loads((d / "out" / "recipe.json").read_text())
    ours = r["rounds"][-1]["routing_flips"]
    windows = _windows(base)
    a, b = _chosen(src, windows), _chosen(d / "out" / "recipe.gguf", windows)
    changed = (a != b).any(axis=-1)
    print("flips", ours, "reference", changed.mean(), changed.mean(axis=1))
    assert 0 < ours["decisions"] < 1
    assert abs(ours["decisions"] - changed.mean()) <= 2 / changed.size  # a near-tie may go either way
    assert r["routing_flips"] == ours and "routing moved on" in p.stdout
    shown = run_cli("report", d / "out" / "recipe.json").stdout
    assert f"{100 * ours['decisions']:.2f} %" in shown


# DeepSeek V3's own rope: yarn, its factor 40 and mscale 1 (here on a 64-token original context)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip


def _deepseek(root, **sizes):
    model = moe_models.build("deepseek-v3", root / "model", qk_nope_head_dim=NOPE, **sizes)
    return model, write_gguf(model, root / "deepseek-v3-F32.gguf", "F32")


@pytest.mark.quick
@pytest.mark.parametrize("rope", ["default", "yarn"])
def test_a_deepseek2_gguf_is_the_transformers_model_it_was_written_from(tmp_path, rope):
    """transformers reads no deepseek2 GGUF: ours gives back every parameter of the model the
    file was written from, bit for bit, and its config (yarn's too, from llama.cpp's keys), so
    the same logits; latent_slots' parts of kv_b_proj hold what gguf reads from attn_k_b
    (transposed per head) and attn_v_b."""
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM

    from kldtool.attribute.units import load_quant
    from kldtool.engines.latent_gguf import latent_slots
    from kldtool.engines.parameter_parts import part_of

    src, path = _deepseek(tmp_path, **({"rope_parameters": YARN} if rope == "yarn" else {}))
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    ours = load_quant(str(path), "float32")
    a, b = ref.state_dict(), ours.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert ours.config.rope_parameters == ref.config.rope_parameters
    ids = torch.randint(3, moe_models.VOCAB, (1, 160), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(ref(ids).logits, ours(ids).logits)
    tensors = {t.name: np.asarray(t.data) for t in GGUFReader(str(path)).tensors}
    slots = latent_slots(ours)
    assert set(slots) == {f"blk.{i}.attn_{w}_b.weight" for i in range(moe_models.LAYERS) for w in ("k", "v")}
    for name, (pname, part) in slots.items():
        got = part_of(ours.get_parameter(pname).detach(), part).numpy()
        want = tensors[name].swapaxes(1, 2) if "attn_k_b" in name else tensors[name]
        assert np.array_equal(got, want), name


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    d = tmp_path_factory.mktemp("recipe-deepseek")
    model, src = _deepseek(d)
    text = moe_models.corpus(d / "corpus.txt")
    base = d / "base.raw"
    run_cli("base", "--engine", "transformers", "-m", model, "-f", text, "-c", 128, "--chunks", 4,
            "--format", "llamacpp", "--kl-divergence-base", base)  # fmt: skip
    p = run_cli("recipe", src, "--kl-divergence-base", base, "--types", "Q4_0,Q8_0", "--bpw", 6.5, "-o", d / "out",
                "--cost-windows", COST_WINDOWS, "--progress", "none")  # fmt: skip
    return model, base, d, p


def test_deepseeks_latent_attention_and_experts_are_candidates(deepseek):
    """Each layer's attn_k_b and attn_v_b (two parts of one transformers parameter), its routed
    and shared experts are candidates; routers and the correction bias stay float, as llama.cpp
    keeps them; the GGUF holds the chosen types."""
    from gguf import GGUFReader

    _, _, d, p = deepseek
    r = json.loads((d / "out" / "recipe.json").read_text())
    tensors = {x["tensor"] for x in json.loads((d / "out" / "costs.json").read_text())["costs"]}
    routed = range(1, moe_models.LAYERS)  # the first layer is dense
    want = {f"blk.{i}.attn_{w}_b.weight" for i in range(moe_models.LAYERS) for w in ("k", "v")}
    want |= {
        f"blk.{i}.ffn_{w}_{kind}.weight" for i in routed for w in ("gate", "up", "down") for kind in ("exps", "shexp")
    }
    assert want <= tensors and not any("ffn_gate_inp" in t or "exp_probs" in t for t in tensors)
    written = {t.name: t.tensor_type.name.lower() for t in GGUFReader(str(d / "out" / "recipe.gguf")).tensors}
    assert {t: written[t] for t in r["types"]} == r["types"]
    assert {written[f"blk.{i}.ffn_gate_inp.weight"] for i in routed} == {"f32"}
    assert 0 < r["routing_flips"]["decisions"] < 1 and "routing moved on" in p.stdout


def test_a_latent_value_tensors_cost_is_a_float64_leave_one_in_forward(deepseek):
    """Layer 1's attn_v_b from llama.cpp's Q4_0 build, read by gguf and put into the value rows
    of each head of the float64 model's kv_b_proj here, by numpy."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers import AutoModelForCausalLM

    model_dir, base, d, _ = deepseek
    tensor = "blk.1.attn_v_b.weight"
    row = next(x for x in json.loads((d / "out" / "costs.json").read_text())["costs"]
               if x["tensor"] == tensor and x["asked"] == "Q4_0")  # fmt: skip
    (build,) = (d / "out" / "builds").glob("*/pure-Q4_0.gguf")
    t = next(t for t in GGUFReader(str(build)).tensors if t.name == tensor)
    v_b = dequantize(t.data, t.tensor_type).reshape([int(x) for x in t.shape[::-1]])  # heads x v x latent
    eager = {"dtype": torch.float64, "experts_implementation": "eager"}  # grouped_mm has no float64
    model = AutoModelForCausalLM.from_pretrained(model_dir, **eager).eval()
    windows, rows = _windows(base), _base_logprobs(base)
    floor = _mean_kld(model, windows, rows)
    kv_b = model.model.layers[1].self_attn.kv_b_proj.weight
    heads = v_b.shape[0]
    with torch.no_grad():
        kv_b.view(heads, -1, kv_b.shape[-1])[:, NOPE:].copy_(torch.from_numpy(v_b.astype(np.float64)))
    above = _mean_kld(model, windows, rows) - floor
    print(tensor, "cost", row["kld_above_base"], "float64", above)
    assert above > 0 and abs(row["kld_above_base"] - above) <= 1e-3 * above + 5e-8


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("deepseek2.attention.kv_lora_rank", 48, "tensor blk.0.attn_kv_a_mqa.weight is (80, 64), its metadata makes"),
        ("deepseek2.attention.key_length_mla", 40, "tensor blk.0.attn_q_b.weight is (192, 32), its metadata makes"),
        ("deepseek2.block_count", 10**9, "deepseek2.block_count is 1000000000, its tensors are of 4 layers"),
    ],
)
def test_a_deepseek2_gguf_whose_metadata_lies_is_one_line(deepseek, tmp_path, key, value, says):
    """A file whose keys disagree with its tensors is refused in one line naming the first
    disagreement, before any build and before a model of the keys' sizes is allocated."""
    import shutil

    from gguf import GGUFReader

    from kldtool.errors import EngineError

    _, base, d, _ = deepseek
    bad = tmp_path / "lying.gguf"
    shutil.copyfile(d / "deepseek-v3-F32.gguf", bad)
    field = GGUFReader(str(bad), "r+").fields[key]
    field.parts[field.data[0]][0] = value
    p = run_cli("recipe", bad, "--kl-divergence-base", base, "--types", "Q4_0", "--bpw", 6.5, "-o", tmp_path / "out",
                "--progress", "none", check_rc=EngineError.exit_code)  # fmt: skip
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "out" / "recipe.json").exists()
