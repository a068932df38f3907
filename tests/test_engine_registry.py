"""The engines' registry: what the CLI shows and refuses is generated from the entries, each
engine's flags show where they apply, and an engine is added by its own package and one name in
PACKAGES (shown with a toy engine made here, through the real builder and the real runs)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from conftest import run_cli
from kldtool import errors
from kldtool.engines import EngineOptions, make_engine, options_from_flags, registry
from kldtool.engines.contract import Facts, whole_windows
from kldtool.engines.registry import EngineEntry

pytestmark = pytest.mark.quick


def _help(*args) -> str:
    return run_cli("compare", *args, "--help").stdout


def test_compare_help_names_the_groups_and_shows_each_where_it_applies():
    plain = _help()
    assert "--server" in plain and "--endpoint" in plain  # they choose an engine: always shown
    for hidden in ("--tensor-parallel-size", "--contexts", "--top-k", "--exchange-dir"):
        assert hidden not in plain, hidden
    assert "--engine llamacpp, --engine vllm, --server URL or --endpoint URL" in " ".join(plain.split())
    vllm = _help("--engine", "vllm")
    assert "--tensor-parallel-size" in vllm and "--kv-cache-dtype" in vllm and "--contexts" not in vllm
    llama = _help("-m", "model.gguf")  # the engine a model path suggests
    assert "--contexts" in llama and "--kv-cache-dtype" in llama and "--tensor-parallel-size" not in llama
    endpoint = _help("--endpoint", "http://127.0.0.1:9")
    assert "--top-k" in endpoint and "--concurrency" in endpoint and "--tensor-parallel-size" not in endpoint
    served = _help("--server", "http://127.0.0.1:9")
    assert "--exchange-dir" in served and "--logits-block" in served and "--quantization" not in served


def _given(**flags) -> dict:
    names = ["engine", "dtype", "device", "threads", "batch", "revision", "gguf_file", *registry.all_flags()]
    return {n: None for n in names} | {"batch": 2048} | flags


def test_every_flag_of_another_engine_is_refused_naming_its_owners():
    """For every engine and every engine-specific flag it does not take: one usage error that
    names the engines (or the selecting flag) that do."""
    for e in registry.entries():
        if not e.listed:
            continue
        for flag in registry.all_flags():
            if flag in e.takes or any(flag in o.selected_by for o in registry.entries()):
                continue
            value = True if flag in ("enforce_eager", "trust_remote_code") else ["a=1"] if flag == "vllm_arg" else 2
            with pytest.raises(errors.UsageError) as got:
                options_from_flags(_given(engine=e.name, **{flag: value}), "m")
            owners = [o.name for o in registry.owners(flag)]
            msg = str(got.value)
            assert msg.startswith("--" + flag.replace("_", "-")), msg
            for o in owners:
                assert (o if registry.entry(o).listed else f"--{registry.entry(o).selected_by[0]} URL") in msg, msg


def test_a_server_refuses_the_settings_that_are_its_own():
    for flag, selector in (("quantization", "server"), ("dtype", "endpoint"), ("tensor_parallel_size", "endpoint")):
        with pytest.raises(errors.UsageError, match="the server's own settings"):
            options_from_flags(_given(**{selector: "http://127.0.0.1:9", flag: "x"}), None)
    got = options_from_flags(_given(server="http://127.0.0.1:9", logits_block=64), None)
    assert (
        got.engine == "vllm-server" and got.specific.logits_block == 64 and got.specific.server == "http://127.0.0.1:9"
    )


def test_options_reach_their_engine_typed():
    got = options_from_flags(_given(contexts=3, kv_cache_dtype="q8_0", flash_attn="on"), "m.gguf")
    assert got.engine == "llamacpp" and got.specific.contexts == 3
    assert (got.specific.attention.kv_cache, got.specific.attention.flash_attn) == ("q8_0", "on")
    v = options_from_flags(_given(engine="vllm", max_model_len=99, enforce_eager=True, vllm_arg=["seed=3"]), "d")
    assert v.specific.max_model_len == 99 and dict(v.specific.llm_args) == {"enforce_eager": True, "seed": 3}


class ToyEngine:
    """A seventh engine: uniform-ish logits from a fixed random matrix over a 40-token vocabulary."""

    name = "toy"

    @classmethod
    def from_options(cls, opts, n_ctx):
        return cls(opts.specific.scale if opts.specific else 1.0)

    def __init__(self, scale: float):
        self.w = np.random.default_rng(0).normal(size=(40, 40)).astype(np.float32) * scale
        self.facts = Facts(name="toy", n_vocab=40, model="toy", dtype="float32", versions={"numpy": np.__version__})

    def tokenize(self, text: bytes):
        return np.frombuffer(text, np.uint8).astype(np.int32) % 40

    def token_strings(self):
        return (str(i).encode() for i in range(40))

    def windows_per_call(self, n_ctx):
        return 2

    def logit_blocks(self, windows):
        return whole_windows([self.w[w.tokens[w.first : w.first + w.n_scored]] for w in windows])

    def close(self):
        pass


class ToyOptions:
    FLAGS = {"toy_scale": (float, None)}

    def __init__(self, scale):
        self.scale = scale

    @classmethod
    def from_flags(cls, given):
        return cls(given.get("toy_scale") or 1.0)


@pytest.fixture
def toy_package(monkeypatch):
    pkg = types.ModuleType("kldtool.engines.toy")
    pkg.ENTRIES = (
        EngineEntry(
            name="toy",
            engine=f"{__name__}:ToyEngine",
            options=f"{__name__}:ToyOptions",
            recognizes=lambda model, gguf: str(model).endswith(".toy"),
        ),
    )
    monkeypatch.setitem(sys.modules, "kldtool.engines.toy", pkg)
    monkeypatch.setattr(registry, "PACKAGES", (*registry.PACKAGES, "toy"))


def test_an_engine_is_its_package_and_one_registry_name(toy_package, tmp_path):
    """Choices, recognition, options, refusals and the runs themselves, with nothing else edited."""
    from kldtool.pipeline import engine_modes
    from kldtool.text.protocols import llamacpp_windows

    assert "toy" in registry.listed() and registry.recognise("weights.toy") == "toy"
    with pytest.raises(errors.UsageError, match="--toy-scale 2: only for --engine toy"):
        options_from_flags(_given(engine="transformers", toy_scale=2), "m")
    weights = tmp_path / "weights.toy"
    weights.write_bytes(b"toy")
    engine = make_engine(options_from_flags(_given(toy_scale=0.5), str(weights)), 16)
    assert engine.facts.name == "toy" and engine.w.std() < 0.75  # its own option reached it
    assert engine.facts.source["path"] == str(weights)  # make_engine records where the model came from
    windows = llamacpp_windows(engine.tokenize(b"the toy engine scores this text" * 4), 16, 3, None)
    nll = engine_modes.nll(engine, windows)
    w = windows[0]  # float64 reference of its NLLs
    logp = engine.w[w.tokens[w.first : w.first + w.n_scored]].astype(np.float64)
    logp = logp - np.log(np.exp(logp).sum(axis=1, keepdims=True))
    want = -logp[np.arange(w.n_scored), w.targets]
    assert np.allclose(nll[0], want, atol=1e-5)
    with pytest.raises(errors.UsageError, match="the toy engine does not give its final hidden states"):
        engine_modes.with_hidden_states(engine)
    with pytest.raises(errors.UsageError, match="the toy engine does not record MoE routing"):
        engine_modes.record_routing(engine)


def test_an_engine_gets_its_entrys_capabilities_without_naming_them(toy_package, tmp_path):
    """The toy engine's Facts name no capabilities; make_engine gives it its entry's."""
    from dataclasses import replace

    from kldtool.engines.contract import ROUTING

    toy = sys.modules["kldtool.engines.toy"]
    toy.ENTRIES = (replace(toy.ENTRIES[0], can=frozenset({ROUTING})),)
    weights = tmp_path / "weights.toy"
    weights.write_bytes(b"toy")
    engine = make_engine(options_from_flags(_given(), str(weights)), 16)
    assert engine.facts.can == frozenset({ROUTING})


def test_an_unknown_engine_lists_the_registrys_names():
    with pytest.raises(errors.UsageError, match="expected one of transformers, llamacpp, vllm, python, xlstm"):
        make_engine(EngineOptions(engine="nope"), 16)
