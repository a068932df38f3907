"""llama-perplexity's offload flags on the llama.cpp engine (engines/llamacpp/offload.py) and the
backend every run records (backend.py): each flag reaches the parameter structs kldtool hands to
llama.cpp's model load and context creation, the start-up preload included; bad values are one
line and write nothing; on this CPU-only build `-ngl 99` warns once and changes no statistic;
a base file computed on another backend is noted by compare and refused by noise-floor; and
setup's --dry-run names each backend's build."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess

import pytest

from conftest import ROOT, WIKI, run_cli
from kldtool import errors
from kldtool.engines.contract import description
from test_cli_errors import fail, one_line_error

FLAGS = {"n_gpu_layers": "99", "split_mode": "row", "main_gpu": 1, "tensor_split": "3,1", "no_kv_offload": True}
CLI_FLAGS = ("-ngl", "99", "-sm", "row", "-mg", "1", "-ts", "3,1", "-nkvo")
WARNING = "warning: this llama.cpp build has no GPU"


@pytest.fixture
def structs(monkeypatch):
    """What kldtool passes to llama_model_load_from_file and llama_init_from_model, recorded
    on the way to the real functions."""
    import llama_cpp

    seen: dict[str, list] = {"model": [], "context": []}
    load, init = llama_cpp.llama_model_load_from_file, llama_cpp.llama_init_from_model

    def recording_load(path, mp):
        split = list(mp.tensor_split[:2]) if mp.tensor_split else None
        seen["model"].append((mp.n_gpu_layers, mp.split_mode, mp.main_gpu, split))
        return load(path, mp)

    def recording_init(model, cp):
        seen["context"].append(cp.offload_kqv)
        return init(model, cp)

    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", recording_load)
    monkeypatch.setattr(llama_cpp, "llama_init_from_model", recording_init)
    return seen


def _engine(model, given: dict, preload: bool):
    from kldtool.engines import make_engine, options_from_flags, start_loading

    if preload:
        from kldtool.engines.llamacpp import load

        start_loading(given, str(model))
        assert [offload.n_gpu_layers for _, offload in load._loads] == [99]  # loading on its thread
    return make_engine(options_from_flags(given, str(model)), 128)


@pytest.mark.quick
@pytest.mark.parametrize("preload", [False, True], ids=["engine-load", "start-up-preload"])
def test_every_flag_reaches_the_structs_llama_cpp_gets(q4_1_gguf, structs, preload, capsys):
    import llama_cpp

    from kldtool.text.protocols import llamacpp_windows

    engine = _engine(q4_1_gguf, FLAGS, preload)
    try:
        engine.logits(llamacpp_windows(engine.tokenize(WIKI.read_bytes()[:4000]), 128, 1, engine.bos_id))
        assert structs["model"] == [(99, llama_cpp.LLAMA_SPLIT_MODE_ROW, 1, [3.0, 1.0])]  # one load: taken if preloaded
        assert structs["context"] and not any(structs["context"])  # every context: offload_kqv False
        described = description(engine.facts)
        assert (described["n_gpu_layers"], described["split_mode"], described["main_gpu"]) == (99, "row", 1)
        assert described["tensor_split"] == [3.0, 1.0] and described["kv_offload"] is False
        assert engine.facts.backend == described["backend"] == "CPU"  # this build offloads nothing
    finally:
        engine.close()
    assert capsys.readouterr().err.count(WARNING) <= 1


@pytest.mark.quick
def test_the_defaults_are_llama_cpps_own(q4_1_gguf, structs):
    import llama_cpp

    engine = _engine(q4_1_gguf, {}, preload=False)
    engine.close()
    default = llama_cpp.llama_model_default_params()
    assert structs["model"] == [(default.n_gpu_layers, default.split_mode, default.main_gpu, None)]


@pytest.mark.quick
@pytest.mark.parametrize(
    "flags, words",
    [
        (("-ngl", "many"), "--n-gpu-layers many: a number of layers or all"),
        (("-ngl", "-3"), "--n-gpu-layers -3"),
        (("-ngl", "auto"), "--n-gpu-layers auto"),
        (("-sm", "diagonal"), "--split-mode diagonal: one of none, layer, row, tensor"),
        (("-mg", "-1"), "--main-gpu -1"),
        (("-ts", "3,x"), "--tensor-split 3,x"),
        (("-ts", "0,0"), "--tensor-split 0,0"),
        (("-ts", "1,nan"), "--tensor-split 1,nan"),
    ],
)
def test_a_bad_offload_value_is_one_line_and_writes_nothing(q4_1_gguf, tmp_path, flags, words):
    out = tmp_path / "b.kld"
    p = fail("base", "-m", q4_1_gguf, "-c", 128, "--chunks", 1, *flags, "--kl-divergence-base", out)
    one_line_error(p, errors.UsageError, words)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.quick
def test_offload_flags_are_refused_for_another_engine(tmp_path):
    p = fail("ppl", "--engine", "transformers", "-ngl", "99", "-c", 64, "--chunks", 1)
    one_line_error(p, errors.UsageError, "--n-gpu-layers 99: only for --engine llamacpp")


def test_ngl_on_a_cpu_build_warns_once_and_changes_no_statistic(fixture_compares, fixture_base, requant, tmp_path):
    """Against the run-shared compare of the same quant without the flags."""
    j = tmp_path / "flags.json"
    p = run_cli("compare", "-m", requant("Q8_0"), "--kl-divergence-base", fixture_base, "--json", j, *CLI_FLAGS)
    assert p.stderr.count(WARNING) == 1, p.stderr
    ours = json.loads(j.read_text())
    plain = json.loads((fixture_compares / "Q8_0" / "Q8_0.json").read_text())
    assert ours["statistics"] == plain["statistics"]
    assert p.stdout == (fixture_compares / "Q8_0" / "Q8_0.out").read_text()
    model = ours["model"]
    assert (model["n_gpu_layers"], model["split_mode"], model["tensor_split"], model["kv_offload"]) == (
        99, "row", [3.0, 1.0], False
    )  # fmt: skip
    assert model["backend"] == ours["manifest"]["backend"] == "CPU"
    assert "engine llamacpp, CPU (" in p.stderr  # the run's first line names the backend


@pytest.fixture(scope="module")
def cuda_base(q4_1_gguf, tmp_path_factory):
    """A small container base of the built-in GGUF whose manifest says a CUDA build made it, as a
    GPU's run would write it."""
    from helpers.container_edit import container_tail, with_metadata

    d = tmp_path_factory.mktemp("cuda")
    real = d / "cpu.kldt"
    run_cli("base", "-m", q4_1_gguf, "-f", WIKI, "-c", 128, "--chunks", 2, "--kl-divergence-base", real)
    data = real.read_bytes()
    meta = json.loads(container_tail(data)[2])
    assert meta["manifest"]["backend"] == meta["model"]["backend"] == "CPU"
    meta["manifest"]["backend"] = meta["model"]["backend"] = "CUDA: NVIDIA H200 (31/31 layers)"
    meta["model"]["device"] = "cuda"
    edited = d / "cuda.kldt"
    edited.write_bytes(with_metadata(data, json.dumps(meta).encode()))
    return edited


@pytest.mark.full_tier
def test_another_backend_is_noted_by_compare_and_refused_by_noise_floor(cuda_base, q4_1_gguf, tmp_path):
    p = run_cli("compare", "-m", q4_1_gguf, "--kl-divergence-base", cuda_base, "--json", tmp_path / "c.json")
    noted = [line for line in p.stderr.splitlines() if line.startswith("warning:") and "backend" in line]
    assert len(noted) == 1 and "CUDA: NVIDIA H200" in noted[0] and "CPU" in noted[0], p.stderr
    assert any("backend" in w for w in json.loads((tmp_path / "c.json").read_text())["warnings"])
    p = fail("noise-floor", "-m", q4_1_gguf, "--kl-divergence-base", cuda_base, "--json", tmp_path / "f.json")
    one_line_error(p, errors.UsageError, "backend", "--force")
    assert not (tmp_path / "f.json").exists()
    run_cli("noise-floor", "-m", q4_1_gguf, "--kl-divergence-base", cuda_base, "--json", tmp_path / "f.json", "--force")
    assert json.loads((tmp_path / "f.json").read_text())["statistics"]["count"] > 0


def _setup_dry_run(**env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("KLDTOOL_LLAMACPP", "KLDTOOL_CUDA_ARCHS")}
    return subprocess.run(
        ["bash", "scripts/setup.sh", "--dry-run"], cwd=ROOT, env=clean | env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.quick
def test_setup_dry_run_names_each_backends_build_and_builds_nothing():
    cuda = _setup_dry_run(KLDTOOL_LLAMACPP="cuda", KLDTOOL_CUDA_ARCHS="86;90")
    assert cuda.returncode == 0, cuda.stderr
    assert "-DGGML_CUDA=on" in cuda.stdout and "-DCMAKE_CUDA_ARCHITECTURES=86;90" in cuda.stdout
    for backend, flag in (("vulkan", "-DGGML_VULKAN=on"), ("metal", "-DGGML_METAL=on"), ("rocm", "-DGGML_HIP=on")):
        assert flag in _setup_dry_run(KLDTOOL_LLAMACPP=backend).stdout
    # The default is the CPU build setup installed here: the same CMake arguments and cache key.
    cpu = _setup_dry_run()
    key = re.search(r"^cache key: (\w+)$", cpu.stdout, re.M).group(1)
    assert (ROOT / ".venv" / ".llamacpp-key").read_text().strip() == key
    if platform.machine() == "x86_64":
        args = (ROOT / "scripts" / "lib" / "llamacpp-cmake-args").read_text().strip()
        assert f"CMAKE_ARGS: {args}\n" in cpu.stdout
    assert key != re.search(r"^cache key: (\w+)$", cuda.stdout, re.M).group(1)
    wrong = _setup_dry_run(KLDTOOL_LLAMACPP="opencl")
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines() == [
        "setup: KLDTOOL_LLAMACPP=opencl: one of cpu, cuda, metal, vulkan, rocm"
    ]
