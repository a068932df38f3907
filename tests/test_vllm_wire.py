"""The served hook's checks without a server: the wire format (what a client of this version sends
parses; anything else is one line naming the field), the operator's settings, and the worker's
hook driven step by step with real logits tensors, as vLLM's runner drives it, over the same
hostile specs the server test sends. vLLM itself is exercised in test_vllm_server.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.spec_fuzz import Fuzzer, Sandbox, Swapper
from kldtool.engines.vllm import wire
from kldtool.engines.vllm.hooked_engine import window_specs
from kldtool.engines.vllm.policy import Policy
from kldtool.engines.vllm.worker import WorkerState
from kldtool.logitsfile import open_base_file
from kldtool.text.protocols import llamacpp_windows

pytestmark = pytest.mark.quick

TOKEN = "s3cret"
MODEL = wire.ModelFacts(n_vocab=49152, hidden_size=576, dtype="float32")
FACTS = {"n_vocab": 49152, "hidden_size": 576, "dtype": "float32"}


@pytest.fixture()
def box(tmp_path, hf_base) -> Sandbox:
    return Sandbox.make(tmp_path / "sandbox", hf_base)


def _operator(box: Sandbox, **overrides) -> dict:
    env = {
        "KLDTOOL_VLLM_HOOK": "1",
        "KLDTOOL_VLLM_BASE_ROOTS": str(box.bases),
        "KLDTOOL_VLLM_EXCHANGE_ROOT": str(box.exchange),
        "KLDTOOL_VLLM_TOKEN": TOKEN,
    }
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def _windows(path):
    reader = open_base_file(path)
    h = reader.header
    return reader, llamacpp_windows(reader.tokens, h.n_ctx, h.n_chunk, None)


def _modes(base: str) -> dict:
    return {
        "compare": {"mode": "compare", "base": base},
        "nll": {"mode": "nll"},
        "encode": {
            "mode": "encode",
            "row_width": 2 * 24576 + 4,
            "coding": {"codec": "grid", "clamp": 16.0, "keep": None},
        },
        "hidden": {"mode": "hidden", "dim": 576, "hidden_item": "<f4", "n_vocab": 49152, "probe_rows": 8},
    }


@pytest.mark.full_tier
def test_what_a_client_sends_parses_for_every_mode(box):
    reader, windows = _windows(box.base)
    for mode, fields in _modes(str(box.base)).items():
        keys, specs = window_specs(windows[:2], 64, lambda w: fields)
        for key, spec, w in zip(keys, specs, windows):
            got = wire.parse(wire.decode(wire.served(spec, str(box.run), TOKEN)), len(w.tokens), MODEL, True)
            assert (got.mode, got.key, got.first, got.n_scored, got.chunk) == (mode, key, w.first, w.n_scored, w.index)
            assert got.out == str(box.run)
            offline = wire.parse(spec, len(w.tokens), MODEL, False)  # the offline engine's dict, no out
            assert offline.out is None and offline.mode == mode


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"v": 1}, "wire protocol version 1 from the client, 2 in the server's kldtool"),
        ({"v": None}, "wire protocol version None from the client"),
        ({"mode": "eval"}, "mode 'eval': expected one of probe, compare, encode, nll, hidden"),
        ({"key": "../escape-1"}, "key '../escape-1': expected 12 hex digits"),
        ({"evil": 1}, "unknown field 'evil' for mode nll"),
        ({"first": -1}, "first -1: expected an integer in 0..127"),
        ({"first": True}, "first True: expected an integer"),
        ({"n_scored": 10**6}, "n_scored 1000000: expected an integer in 1..64"),
        ({"after": 49152}, "after 49152: expected an integer in 0..49151"),
        ({"logits_block": 0}, "logits_block 0: expected an integer in 1..2147483647"),
        ({"chunk": 2.0}, "chunk 2.0: expected an integer"),
        ({"mode": "compare", "base": "relative.kldt"}, "base 'relative.kldt': expected an absolute path"),
        (
            {"mode": "hidden", "dim": 10**6, "hidden_item": "<f4", "n_vocab": 49152, "probe_rows": 0},
            "dim 1000000: the model's hidden size is 576",
        ),
        (
            {"mode": "hidden", "dim": 576, "hidden_item": "<f8", "n_vocab": 49152, "probe_rows": 0},
            "hidden_item '<f8': a float32 model's is <f4",
        ),
        (
            {"mode": "hidden", "dim": 576, "hidden_item": "<f4", "n_vocab": 49152, "probe_rows": 10**9},
            "probe_rows 1000000000: expected an integer in 0..63",
        ),
        (
            {"mode": "encode", "row_width": 10, "coding": {"codec": "grid", "clamp": 16.0, "keep": None}},
            "row_width 10: the model's row width is 49156",
        ),
        (
            {"mode": "encode", "row_width": 49156, "coding": {"codec": "grid", "clamp": float("nan"), "keep": None}},
            "coding.clamp nan: expected 16..64 nats",
        ),
    ],
)
def test_anything_else_is_one_line_naming_the_field(change, reason):
    spec = {
        "v": 2,
        "key": "0123456789ab-3",
        "mode": "nll",
        "first": 64,
        "n_scored": 63,
        "chunk": 3,
        "after": 5,
        "logits_block": 64,
        **change,
    }
    with pytest.raises(wire.SpecError) as e:
        wire.parse(spec, 128, MODEL, False)
    assert reason in str(e.value) and "\n" not in str(e.value)


def test_a_logits_block_past_the_hooks_budget_is_cut_to_it():
    spec = {"v": 2, "key": "0123456789ab-3", "mode": "nll", "first": 64, "n_scored": 63, "chunk": 3, "after": 5}
    assert wire.parse({**spec, "logits_block": 10**6}, 128, MODEL, False).logits_block == 2730  # 1 GiB at 49k fp32
    assert wire.parse({**spec, "logits_block": 64}, 128, MODEL, False).logits_block == 64


@pytest.mark.parametrize(
    "raw, reason",
    [
        ("x" * 9000, "spec of 9000 characters (at most 8192)"),
        ("[" * 4000 + "]" * 4000, "spec is not JSON"),
        ('{"v": NaN}', "spec is not JSON (NaN is not a number JSON allows)"),
        ("[1]", "spec is a list, not an object"),
        (7, "spec is a int, not an object"),
    ],
)
def test_text_that_is_no_spec_is_refused_before_it_is_parsed_further(raw, reason):
    with pytest.raises(wire.SpecError) as e:
        wire.decode(raw)
    assert reason in str(e.value)


def test_the_operators_settings(box, tmp_path):
    ok = Policy.from_environment(_operator(box))
    assert ok.problem is None and ok.base_roots == (str(box.bases),) and ok.token_ok(TOKEN)
    assert not ok.token_ok("s3cre") and not ok.token_ok(None) and not ok.token_ok(7)
    assert Policy.from_environment(_operator(box, KLDTOOL_VLLM_TOKEN=None)).token_ok(None)
    missing = Policy.from_environment(_operator(box, KLDTOOL_VLLM_BASE_ROOTS=None))
    assert missing.problem == (
        "kldtool's hook is off on this server: KLDTOOL_VLLM_BASE_ROOTS is not set: the server's "
        "operator names the directories base files may be read from (dir1:dir2)"
    )
    relative = Policy.from_environment(_operator(box, KLDTOOL_VLLM_BASE_ROOTS="bases", KLDTOOL_VLLM_EXCHANGE_ROOT=None))
    assert "KLDTOOL_VLLM_BASE_ROOTS: bases is not an absolute path" in relative.problem
    assert "KLDTOOL_VLLM_EXCHANGE_ROOT is not set" in relative.problem
    # Paths are resolved before they are checked: a link out of the roots is out of them.
    assert ok.base_file(str(box.base)) == str(box.base)
    for path, why in (
        (box.bases / "to-secret.kldt", "is outside KLDTOOL_VLLM_BASE_ROOTS"),
        (box.bases / "secrets" / "secret.txt", "is outside"),
        (box.bases / ".." / "secrets", "is outside"),
        (box.bases / "fifo.kldt", "is not a regular file"),
        (box.bases / "dir.kldt", "not a regular file"),
        (box.bases / "absent.kldt", "No such file or directory"),
        (Path("/etc/passwd"), "is outside"),
    ):
        with pytest.raises(Exception) as e:
            ok.base_file(str(path))
        assert why in str(e.value), (path, e.value)
    held = ok.exchange_dir(str(box.run))  # the directory itself, held open (confined.py)
    try:
        assert os.path.samestat(os.fstat(held.fd), os.stat(box.run))
    finally:
        held.close()
    for out in (box.exchange / "escape", box.outside, box.exchange / ".." / "outside", Path("/tmp")):
        with pytest.raises(Exception, match="is outside KLDTOOL_VLLM_EXCHANGE_ROOT"):
            ok.exchange_dir(str(out))


class Runner:
    """Drives a WorkerState as vLLM's runner does: each request's prompt in steps of ``step``
    tokens, real logits tensors from a random head over random hidden states, then a sweep."""

    def __init__(self, state: WorkerState, step: int = 48, fail_at: int | None = None):
        self.state, self.step, self.fail_at = state, step, fail_at
        g = torch.Generator().manual_seed(0)
        self.head = torch.randn(576, 49152, generator=g) * 0.05
        self.calls = 0

    def logits(self, hidden):
        self.calls += 1
        if self.calls == self.fail_at:
            return hidden  # the wrong shape: the request's reduction fails
        return hidden @ self.head

    def run(self, requests: list[tuple[str, list[int], object]]) -> None:
        for req_id, prompt, raw in requests:
            hidden = torch.randn(len(prompt), 576, generator=torch.Generator().manual_seed(len(prompt)))
            for start in range(0, len(prompt), self.step):
                n = min(self.step, len(prompt) - start)
                self.state.step(
                    req_id, raw, prompt, start, n, lambda a, b: self.logits(hidden[a:b]), lambda a, b: hidden[a:b]
                )
        self.state.sweep(lambda r: False)


@pytest.mark.full_tier
def test_every_hostile_spec_ends_in_its_own_error_and_nothing_escapes(box):
    """The server test's hostile specs (its fixed cases and 300 random ones), in process: no
    exception leaves the hook, every case leaves what its envelope says (one result file, or
    nothing) with the reason its mutation calls for, nothing is written outside the exchange
    directory, every error is one line, no answer holds a byte of a file that is not a base
    file, a base file swapped while requests name it is read only as it was checked, and a real
    window between them is scored as usual."""
    reader, windows = _windows(box.base)
    w = windows[0]
    fuzz = Fuzzer(box, TOKEN, 49152, [int(t) for t in w.tokens], w.first, w.n_scored)
    state = WorkerState(FACTS, Policy.from_environment(_operator(box)), rank=0)
    cases = fuzz.cases(300)
    keys, (good,) = window_specs([w], 64, lambda w: {"mode": "compare", "base": str(box.base)})
    requests = [(f"r{i}", prompt, raw) for i, (_, prompt, raw) in enumerate(cases)]
    requests.insert(len(requests) // 2, ("real", [int(t) for t in w.tokens], wire.served(good, str(box.run), TOKEN)))
    with Swapper(box, box.base):
        Runner(state).run(requests)
    print(f"{fuzz.fixed} fixed and {fuzz.random} random cases")
    assert fuzz.random >= 300 and not fuzz.problems(box.run)
    assert not state.requests and len(state.feeds) <= 4  # the most a worker keeps open
    files = sorted(box.run.iterdir())
    assert all(p.suffix in (".err", ".npz", ".json") and "\n" not in p.name for p in files)
    assert not list(box.outside.iterdir()) and sorted(os.listdir(box.exchange)) == ["escape", "run"]
    errors = [p.read_bytes() for p in files if p.suffix == ".err"]
    assert len(errors) > 150 and all(b"\n" not in e for e in errors)
    assert not [e for e in errors if box.secret_bytes in e or b"root:x" in e]
    with np.load(box.run / f"{keys[0]}.npz") as z:
        assert z["kld"].shape == (w.n_scored,) and np.isfinite(z["kld"]).all() and (z["kld"] >= -1e-6).all()


def test_a_misconfigured_server_refuses_every_request_with_the_operators_line(box):
    state = WorkerState(FACTS, Policy.from_environment(_operator(box, KLDTOOL_VLLM_BASE_ROOTS=None)), rank=0)
    reader, windows = _windows(box.base)
    w = windows[0]
    probe = wire.served(wire.probe_spec("00000000000a-probe"), str(box.run), TOKEN)
    keys, specs = window_specs([w], 64, lambda w: {"mode": "nll"})
    Runner(state).run(
        [("p", [1, 2], probe), ("n", [int(t) for t in w.tokens], wire.served(specs[0], str(box.run), TOKEN))]
    )
    for key in ("00000000000a-probe", keys[0]):
        assert (box.run / f"{key}.err").read_text() == Policy.from_environment(
            _operator(box, KLDTOOL_VLLM_BASE_ROOTS=None)
        ).problem


def test_a_failure_inside_a_request_is_its_error_and_an_abandoned_request_is_dropped(box):
    reader, windows = _windows(box.base)
    state = WorkerState(FACTS, Policy.from_environment(_operator(box)), rank=0)
    keys, specs = window_specs(windows[:2], 16, lambda w: {"mode": "nll"})
    # The first window's second logits block comes back malformed; the second window goes on.
    Runner(state, fail_at=2).run(
        [(k, [int(t) for t in w.tokens], wire.served(s, str(box.run), TOKEN)) for k, w, s in zip(keys, windows, specs)]
    )
    assert (box.run / f"{keys[0]}.err").read_text().startswith("RuntimeError: ")
    with np.load(box.run / f"{keys[1]}.npz") as z:
        assert z["nll"].shape == (windows[1].n_scored,)
    # A request vLLM drops halfway (a client gone): forgotten at the next sweep, nothing written.
    keys, specs = window_specs(windows[2:3], 64, lambda w: {"mode": "nll"})
    w = windows[2]
    state.step(
        "gone",
        wire.served(specs[0], str(box.run), TOKEN),
        [int(t) for t in w.tokens],
        0,
        80,
        lambda a, b: torch.zeros(b - a, 49152),
        lambda a, b: None,
    )
    assert "gone" in state.requests
    state.sweep(lambda r: False)
    assert (
        not state.requests and not (box.run / f"{keys[0]}.npz").exists() and not (box.run / f"{keys[0]}.err").exists()
    )


def test_only_the_operators_token_opens_the_hook(box):
    reader, windows = _windows(box.base)
    w = windows[0]
    state = WorkerState(FACTS, Policy.from_environment(_operator(box)), rank=0)
    keys, specs = window_specs([w, w], 64, lambda w: {"mode": "nll"})
    prompt = [int(t) for t in w.tokens]
    runner = Runner(state)
    runner.run(
        [
            ("a", prompt, wire.served(specs[0], str(box.run), "wrong")),
            ("b", prompt, json.dumps({**specs[1], "out": str(box.run)})),
        ]
    )
    assert not list(box.run.iterdir()) and runner.calls == 0  # told nothing, no logits computed


def _one_step_each(state: WorkerState, requests: list[tuple[str, list[int], object]], step: int = 48) -> None:
    """Every request's prompt in steps of ``step`` tokens, all requests of a step handled in one
    loop with no guard of its own, as the seam's step loops over vLLM's batch: an exception for
    one request would abandon the others of that step (issue 62's first hole)."""
    g = torch.Generator().manual_seed(0)
    head = torch.randn(576, 49152, generator=g) * 0.05
    hidden = {r: torch.randn(len(p), 576, generator=torch.Generator().manual_seed(len(p))) for r, p, _ in requests}
    for start in range(0, max(len(p) for _, p, _ in requests), step):
        for req_id, prompt, raw in requests:
            if start < len(prompt):
                h = hidden[req_id]
                n = min(step, len(prompt) - start)
                state.step(req_id, raw, prompt, start, n, lambda a, b, h=h: h[a:b] @ head, lambda a, b, h=h: h[a:b])
    state.sweep(lambda r: False)


def test_a_lone_surrogate_fails_only_its_own_request_in_a_shared_step(box):
    """A token, an exchange directory or a base path holding a lone surrogate (JSON's "\\ud800",
    plain ASCII on the wire) raised UnicodeEncodeError out of the hook's step, past its checks,
    and the seam's guard then dropped every other request of that step."""
    reader, windows = _windows(box.base)
    prompts = [[int(t) for t in w.tokens] for w in windows[:5]]
    policy = Policy.from_environment(_operator(box))
    keys, specs = window_specs(windows[:5], 64, lambda w: {"mode": "compare", "base": str(box.base)})
    legit = [("legit-a", prompts[0], wire.served(specs[0], str(box.run), TOKEN))]
    legit.append(("legit-b", prompts[4], wire.served(specs[4], str(box.run), TOKEN)))
    _one_step_each(WorkerState(FACTS, policy, rank=0), legit)  # the two alone first
    alone = {}
    for key in (keys[0], keys[4]):
        with np.load(box.run / f"{key}.npz") as z:
            alone[key] = z["kld"].copy()
        (box.run / f"{key}.npz").unlink()
    hostile = [
        wire.served(specs[1], str(box.run), "\ud800"),  # json.dumps keeps it as the escape \ud800
        wire.served(specs[2], str(box.run) + "/\ud800", TOKEN),
        wire.served({**specs[3], "base": str(box.bases) + "/\udfff.kldt"}, str(box.run), TOKEN),
    ]
    assert all("\\ud" in h or "\\udfff" in h for h in hostile)
    requests = [legit[0], *((f"hostile-{i}", prompts[i + 1], h) for i, h in enumerate(hostile)), legit[1]]
    _one_step_each(WorkerState(FACTS, policy, rank=0), requests)
    for key in (keys[0], keys[4]):  # each legitimate window as it was alone
        with np.load(box.run / f"{key}.npz") as z:
            assert z["kld"].shape == (windows[0].n_scored,) and np.array_equal(z["kld"], alone[key])
    # The bad base path is refused in its own error file; the other two may write nothing.
    assert "expected a path (UTF-8 text, no NUL" in (box.run / f"{keys[3]}.err").read_text()
    assert not (box.run / f"{keys[1]}.err").exists() and not (box.run / f"{keys[1]}.npz").exists()
    assert sorted(p.name for p in box.run.iterdir()) == sorted([f"{keys[0]}.npz", f"{keys[3]}.err", f"{keys[4]}.npz"])
    assert not Policy.from_environment(_operator(box)).token_ok("\ud800")


def test_a_base_file_swapped_after_its_check_is_never_read(box, tmp_path, fixture_base):
    """The worker kept base files open by path and re-opened one whenever its identity changed,
    without the roots' or the regular-file check, following symlinks (issue 62's second hole).
    Now a request reads the descriptor its checks opened, to the end."""
    import signal

    reader, windows = _windows(box.base)
    w = windows[0]
    prompt = [int(t) for t in w.tokens]
    policy = Policy.from_environment(_operator(box))
    keys, specs = window_specs([w] * 4, 64, lambda w: {"mode": "compare", "base": str(box.base)})

    def served(i):
        return wire.served(specs[i], str(box.run), TOKEN)

    alone = WorkerState(FACTS, policy, rank=0)
    _one_step_each(alone, [("ref", prompt, served(0))])
    with np.load(box.run / f"{keys[0]}.npz") as z:
        reference = z["kld"].copy()
    # Another valid base file of the same windows outside the roots (llama.cpp's, of the Q4_1
    # model), its rows different: what a swap would have the worker read.
    elsewhere = box.outside / "other.kld"
    elsewhere.write_bytes(fixture_base.read_bytes())
    state = WorkerState(FACTS, policy, rank=0)
    state.step("r1", served(1), prompt, 0, 48, *_logits_and_hidden(prompt))  # admitted, partly scored
    original = tmp_path / "original.kldt"
    os.rename(box.base, original)
    box.base.symlink_to(elsewhere)  # swapped between two steps
    for start in range(48, len(prompt), 48):
        n = min(48, len(prompt) - start)
        state.step("r1", served(1), prompt, start, n, *_logits_and_hidden(prompt))
    with np.load(box.run / f"{keys[1]}.npz") as z:
        assert np.array_equal(z["kld"], reference)  # the checked file's rows, not the swapped-in ones
    # A new request naming the path now: refused, whatever the worker has open.
    _one_step_each(state, [("r2", prompt, served(2))])
    assert "is outside KLDTOOL_VLLM_BASE_ROOTS" in (box.run / f"{keys[2]}.err").read_text()
    # Swapped for a FIFO: refused at once (an open that blocked would hang vLLM's step).
    box.base.unlink()
    os.mkfifo(box.base)
    signal.alarm(20)
    try:
        _one_step_each(state, [("r3", prompt, served(3))])
    finally:
        signal.alarm(0)
    assert "is not a regular file" in (box.run / f"{keys[3]}.err").read_text()
    # The last component turned into a symlink between the check and the open: not followed.
    box.base.unlink()
    box.base.symlink_to(elsewhere)
    real = os.path.realpath
    try:
        os.path.realpath = lambda p, **kw: p  # the check saw a file there; the open finds a link
        with pytest.raises(Exception, match="Too many levels of symbolic links|outside"):
            policy.open_base(str(box.base))
    finally:
        os.path.realpath = real


def test_a_base_file_changed_in_place_fails_the_requests_reading_it(box):
    reader, windows = _windows(box.base)
    w = windows[0]
    prompt = [int(t) for t in w.tokens]
    state = WorkerState(FACTS, Policy.from_environment(_operator(box)), rank=0)
    keys, specs = window_specs([w], 64, lambda w: {"mode": "compare", "base": str(box.base)})
    raw = wire.served(specs[0], str(box.run), TOKEN)
    state.step("r", raw, prompt, 0, 48, *_logits_and_hidden(prompt))
    with open(box.base, "ab") as f:
        f.write(b"\0" * 16)  # rewritten in place: another size and mtime, the same inode
    for start in range(48, len(prompt), 48):
        state.step("r", raw, prompt, start, min(48, len(prompt) - start), *_logits_and_hidden(prompt))
    assert "changed while the request ran" in (box.run / f"{keys[0]}.err").read_text()


def _logits_and_hidden(prompt):
    g = torch.Generator().manual_seed(0)
    head = torch.randn(576, 49152, generator=g) * 0.05
    hidden = torch.randn(len(prompt), 576, generator=torch.Generator().manual_seed(len(prompt)))
    return (lambda a, b: hidden[a:b] @ head), (lambda a, b: hidden[a:b])


def test_a_request_above_the_operators_memory_bound_is_refused_before_it_allocates(box):
    """KLDTOOL_VLLM_MAX_REQUEST_BYTES: an encode request (a uint16 row of the whole vocabulary per
    position, 63 x 49,156 x 2 bytes = 6.2 MB of rows alone, plus its logits block) above an 8 MiB
    bound is refused in its own error file and asks no logits of any rank; the NLL request sent
    with it (about 6.3 MB: a 16-row block of float32 logits and their copy) is served as alone."""
    reader, windows = _windows(box.base)
    w = windows[0]
    prompt = [int(t) for t in w.tokens]
    policy = Policy.from_environment(_operator(box, KLDTOOL_VLLM_MAX_REQUEST_BYTES="8M"))
    assert policy.problem is None and policy.max_request_bytes == 8 << 20
    (nll_key,), (nll_spec,) = window_specs([w], 16, lambda w: {"mode": "nll"})
    alone = Runner(WorkerState(FACTS, policy, rank=0))
    alone.run([("n", prompt, wire.served(nll_spec, str(box.run), TOKEN))])
    with np.load(box.run / f"{nll_key}.npz") as z:
        want = z["nll"].copy()
    (box.run / f"{nll_key}.npz").unlink()
    (enc_key,), (enc_spec,) = window_specs([windows[1]], 16, lambda w: _modes(str(box.base))["encode"])
    both = Runner(WorkerState(FACTS, policy, rank=0))
    requests = [("e", [int(t) for t in windows[1].tokens], enc_spec), ("n", prompt, nll_spec)]
    both.run([(r, p, wire.served(s, str(box.run), TOKEN)) for r, p, s in requests])
    refusal = (box.run / f"{enc_key}.err").read_text()
    assert refusal.startswith("encode request of 63 scored positions needs ") and "\n" not in refusal
    assert refusal.split(" in the hook")[0].endswith("MiB") and "KLDTOOL_VLLM_MAX_REQUEST_BYTES of 8.0 MiB" in refusal
    assert both.calls == alone.calls  # the refused request asked for no logits
    with np.load(box.run / f"{nll_key}.npz") as z:
        assert np.array_equal(z["nll"], want)
    bad = Policy.from_environment(_operator(box, KLDTOOL_VLLM_MAX_REQUEST_BYTES="lots"))
    assert bad.problem.endswith("KLDTOOL_VLLM_MAX_REQUEST_BYTES=lots: expected a size in bytes such as 2G or 512M")


def test_the_default_memory_bound_refuses_4096_rows_of_a_128k_vocabulary_and_admits_long_compares():
    """Unset, the bound is sized for the model: an encode of 4,096 positions of Llama 3's 128,256
    entries (1.05 GB of uint16 rows alone) is refused; a compare of a 131,072-token window's
    65,536 scored positions, whose records are a few MB, is admitted."""
    from kldtool.engines.vllm import request_memory
    from kldtool.logitsfile.header import rows_width

    llama3 = wire.ModelFacts(n_vocab=128256, hidden_size=4096, dtype="bfloat16")
    block = wire.logits_block_rows(llama3.n_vocab, llama3.itemsize)
    encode = wire.Spec(mode="encode", key="k", n_scored=4096, logits_block=block, row_width=rows_width(128256, None))
    with pytest.raises(wire.SpecError, match=r"its default for this model\): score shorter windows"):
        request_memory.check(encode, llama3, None)
    request_memory.check(encode, llama3, 4 << 30)  # the operator's 4 GiB admits it
    request_memory.check(
        wire.Spec(mode="compare", key="k", n_scored=65536, logits_block=block, base="/b"), llama3, None
    )
    assert request_memory.parse_bytes("2G") == 2 << 30 and request_memory.parse_bytes("512MiB") == 512 << 20
