"""--engine python: a model transformers does not know (a small GRU defined in
tests/helpers/tiny_lm.py) through ppl, base and compare, against float64 numpy."""

import json

import numpy as np
import pytest
import torch

from conftest import ROOT, WIKI, run_cli

pytestmark = pytest.mark.quick

HELPERS = ROOT / "tests" / "helpers"
BASE = f"{HELPERS / 'tiny_lm.py'}:make_base"
QUANT = f"{HELPERS / 'tiny_lm.py'}:make_quant"
CTX, CHUNKS = 64, 6


def _logp(factory: str, ids: np.ndarray) -> np.ndarray:
    import importlib.util

    spec = importlib.util.spec_from_file_location("tiny_lm_ref", HELPERS / "tiny_lm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = getattr(mod, factory.rsplit(":", 1)[1])().double()
    with torch.inference_mode():
        return torch.log_softmax(model(torch.from_numpy(ids.astype(np.int64))), dim=-1).numpy()


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "t.txt"
    path.write_bytes(WIKI.read_bytes()[:4000])
    return path


def _chunks(text) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's chunks of the byte stream and the scored rows' targets."""
    ids = np.frombuffer(text.read_bytes().rstrip(b"\n"), dtype=np.uint8)[: CTX * CHUNKS].reshape(CHUNKS, CTX)
    return ids, ids[:, CTX // 2 + 1 :]


def test_ppl_of_a_custom_model_equals_float64(text, tmp_path):
    out = tmp_path / "p.json"
    run_cli("ppl", "--engine", "python", "-m", BASE, "-f", text, "-c", CTX, "--chunks", CHUNKS, "--json", out)
    r = json.loads(out.read_text())
    ids, targets = _chunks(text)
    logp = _logp(BASE, ids)[:, CTX // 2 : CTX - 1]
    nll = -np.take_along_axis(logp, targets[..., None].astype(np.int64), -1)
    assert r["scored_tokens"] == nll.size
    assert r["ppl"] == pytest.approx(np.exp(nll.mean()), rel=1e-6)
    assert r["model"]["engine"] == "python" and r["model"]["name"] == "tiny-gru"


@pytest.mark.full_tier
def test_base_and_compare_with_a_custom_model(text, tmp_path):
    base = tmp_path / "base.kldt"
    run_cli(
        "base",
        "--engine",
        "python",
        "-m",
        BASE,
        "-f",
        text,
        "-c",
        CTX,
        "--chunks",
        CHUNKS,
        "--kl-divergence-base",
        base,
    )
    # The module form, found through PYTHONPATH as a package would be.
    out = tmp_path / "c.json"
    run_cli(
        "compare",
        "-m",
        "tiny_lm:make_quant",
        "--engine",
        "python",
        "--kl-divergence-base",
        base,
        "--json",
        out,
        env_extra={"PYTHONPATH": str(HELPERS)},
    )
    s = json.loads(out.read_text())["statistics"]
    ids, targets = _chunks(text)
    lb, lq = (_logp(f, ids)[:, CTX // 2 : CTX - 1] for f in (BASE, QUANT))
    kld = (np.exp(lb) * (lb - lq)).sum(-1)
    nll_q = -np.take_along_axis(lq, targets[..., None].astype(np.int64), -1)
    assert s["ppl_q"]["value"] == pytest.approx(np.exp(nll_q.mean()), rel=1e-6)
    # The base side went through the uint16 codec: agreement to its resolution.
    assert s["kld_mean"]["value"] == pytest.approx(kld.mean(), rel=2e-3)
    assert s["same_top_p"]["value"] == pytest.approx((lb.argmax(-1) == lq.argmax(-1)).mean(), abs=1e-12)


def test_custom_model_errors_are_one_line(text, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def make():\n    return object()\n")
    for spec, said in (
        (f"{bad}:make", "has no tokenizer"),
        (f"{bad}:missing", "has no callable 'missing'"),
        ("no_such_module_x:make", "cannot import no_such_module_x"),
        (f"{tmp_path / 'nofile.py'}:make", "no such file"),
    ):
        p = run_cli("ppl", "--engine", "python", "-m", spec, "-f", text, check_rc=6)
        assert said in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_checkpoint_sweep_writes_one_table(text, tmp_path):
    csv_path = tmp_path / "sweep.csv"
    p = run_cli(
        "ppl",
        "--engine",
        "python",
        "-m",
        BASE,
        "-m",
        QUANT,
        "-f",
        text,
        "-c",
        CTX,
        "--chunks",
        CHUNKS,
        "--csv",
        csv_path,
        "--json",
        tmp_path / "s.json",
    )
    runs = json.loads((tmp_path / "s.json").read_text())["runs"]
    rows = csv_path.read_text().splitlines()
    assert rows[0].startswith("model,ppl,") and len(rows) == 3
    for row, run in zip(rows[1:], runs):
        model, ppl = row.split(",")[:2]
        assert model == run["model"]["model"] and float(ppl) == run["ppl"]
        assert f"{run['ppl']:10.4f}" in p.stdout


def test_a_window_table_that_lies_is_refused_in_one_line(text, tmp_path):
    """A window-table container whose table claims fewer rows than its window scores."""
    import struct

    from kldtool import errors

    base = tmp_path / "base.kldt"
    run_cli(
        "base",
        "--engine",
        "python",
        "-m",
        BASE,
        "-f",
        text,
        "--protocol",
        "exl3",
        "-c",
        CTX,
        "--stride",
        32,
        "--kl-divergence-base",
        base,
    )
    data = bytearray(base.read_bytes())
    n_stream = struct.unpack_from("<I", data, 28)[0]
    start, length, first, n = struct.unpack_from("<4q", data, 32 + 4 * n_stream)
    assert (length, first, n) == (CTX, 0, CTX - 1)
    struct.pack_into("<q", data, 32 + 4 * n_stream + 24, n - 1)
    bad = tmp_path / "bad.kldt"
    bad.write_bytes(bytes(data))
    p = run_cli(
        "compare", "--engine", "python", "-m", QUANT, "--kl-divergence-base", bad, check_rc=errors.CorruptData.exit_code
    )
    assert "invalid window table" in p.stderr and "window 0" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
