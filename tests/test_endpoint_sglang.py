"""`compare --endpoint --endpoint-api sglang`: SGLang's native `/generate` form. No SGLang runs
here: its wheels (sglang 0.5.23, sglang-kernel 0.4.10) are CUDA builds. So a stand-in on
127.0.0.1 speaks the form as sglang 0.5.23's tokenizer manager writes it (`meta_info`'s
`input_token_logprobs` and `input_top_logprobs`, (log-prob, id, text) triples, the first
position empty) around real numbers: llama.cpp's, each request evaluated afresh. The reference
is `compare --engine llamacpp --flash-attn off` of the same GGUF."""

import http.server
import json
import re
import threading

import h5py
import numpy as np
import pytest

from conftest import run_cli

pytestmark = [pytest.mark.filterwarnings("ignore")]

CHUNKS = 2


class _Sglang(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, body: dict, status: int = 200):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != "/v1/models":
            return self._send({"detail": "Not Found"}, 404)
        self._send({"object": "list", "data": [{"id": "served", "root": self.server.gguf}]})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/generate":
            return self._send({"detail": "Not Found"}, 404)
        ids, k = [int(t) for t in req["input_ids"]], int(req.get("top_logprobs_num") or 0)
        with self.server.lock:
            llm = self.server.llm
            llm.reset()
            llm.eval(ids)
            x = np.array(llm.scores[: len(ids)], np.float64)
        logp = x - x.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        own = [[None, ids[0], None]] + [[float(logp[j - 1, ids[j]]), ids[j], None] for j in range(1, len(ids))]
        tops = [None]
        for j in range(1, len(ids)):
            best = np.argsort(-logp[j - 1], kind="stable")[:k]
            tops.append([[float(logp[j - 1, t]), int(t), None] for t in best])
        meta = {"input_token_logprobs": own, "input_top_logprobs": tops, "prompt_tokens": len(ids)}
        self._send({"text": "", "meta_info": meta})


@pytest.fixture(scope="module")
def runs(q4_1_gguf, fixture_base, tmp_path_factory):
    from llama_cpp import Llama

    d = tmp_path_factory.mktemp("sglang")
    args = ("-m", q4_1_gguf, "--kl-divergence-base", fixture_base, "--chunks", CHUNKS)
    out = {"dir": d}
    out["offline"] = run_cli(
        "compare", *args, "--flash-attn", "off", "--json", d / "off.json", "--per-token", d / "off.h5"
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sglang)
    server.gguf, server.lock = str(q4_1_gguf), threading.Lock()
    server.llm = Llama(str(q4_1_gguf), logits_all=True, n_ctx=256, n_threads=1, verbose=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        common = ("compare", "--endpoint", url, *args, "--top-k", 20)
        out["auto"] = run_cli(*common, "--json", d / "ep.json", "--per-token", d / "ep.h5")
        out["named"] = run_cli(*common, "--endpoint-api", "sglang", "--json", d / "named.json")
    finally:
        server.shutdown()
        server.server_close()
    return out


def test_the_sglang_form_gives_the_llamacpp_compare(runs):
    off = json.loads((runs["dir"] / "off.json").read_text())["statistics"]
    ep = json.loads((runs["dir"] / "ep.json").read_text())["statistics"]
    assert "engine endpoint (sglang, top 20)" in runs["auto"].stderr  # auto picked it: /v1/completions is absent
    assert ep["endpoint"]["api"] == "sglang" and ep["count"] == off["count"] == CHUNKS * 63
    for key in ("ppl_q", "ppl_base", "ln_ppl_ratio", "rms_dp", "dp_mean"):
        assert ep[key]["value"] == pytest.approx(off[key]["value"], rel=1e-5, abs=1e-7), key
    # ids, not texts: the same top is exact here
    assert ep["same_top_p"]["value"] == off["same_top_p"]["value"]
    named = json.loads((runs["dir"] / "named.json").read_text())["statistics"]
    assert named["kld_mean"] == ep["kld_mean"]
    with h5py.File(runs["dir"] / "off.h5") as f, h5py.File(runs["dir"] / "ep.h5") as g:
        for key in ("kld", "rkld", "jsd"):
            assert (g[key][:] <= f[key][:] + 2e-6).all(), key
        tv = f["tv"][:]
        assert (g["tv"][:] <= tv + 1e-5).all() and (tv <= g["tv_hi"][:] + 1e-5).all()


@pytest.mark.quick
def test_an_sglang_answer_is_checked_as_a_whole():
    """SGLang's (log-prob, id, text) triples: a good answer reads into positions; a repeated id
    in a top list, a top list summing above 1, or the scored token named differently is refused
    in one line naming the position (issue 79)."""
    from kldtool.engines.endpoint.forms import SglangForm
    from kldtool.errors import EngineError

    prompt = [5, 7, 9]

    def answer(tops, own=None):
        own = own or [[None, 5, "a"], [-0.5, 7, "b"], [-1.5, 9, "c"]]
        return {"meta_info": {"input_token_logprobs": own, "input_top_logprobs": tops}}

    good = [None, [[-0.5, 7, "b"], [-2.0, 3, "x"]], [[-0.3, 4, "d"], [-1.5, 9, "c"]]]
    read = SglangForm().read(answer(good), prompt, 2, "srv")
    assert read[1].own == -0.5 and read[1].ranked == [(7, -0.5), (3, -2.0)] and read[2].ranked[1] == (9, -1.5)
    cases = [
        ([None, [[-0.5, 7, "b"], [-0.6, 7, "b"]], good[2]], "position 1: the answer names token 7 more than once"),
        ([None, [[-0.1, 7, "b"], [-0.2, 3, "x"]], good[2]], "position 1: the top 2 log-probs sum to a probability"),
        (
            [None, good[1], [[-0.9, 4, "d"], [-1.0, 9, "c"]]],
            "position 2: token 9's log-prob is -1.5 and, in the top K, -1",
        ),
    ]
    for tops, says in cases:
        with pytest.raises(EngineError, match=re.escape(says)):
            SglangForm().read(answer(tops), prompt, 2, "srv")
