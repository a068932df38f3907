"""`long_window_memory.py --phase llamacpp`: one window of 8k, 32k and 131,072 tokens through
llama.cpp, and llama-perplexity at the same lengths, under one memory limit.

The model is tests/helpers' llama3-128k: a random-weight Llama 3 shape with Llama 3's 128,256
vocabulary and 131,072-token context (rope base 500,000; 2 layers, 2 query heads and one
key-value head of 64, so a CPU runs a 128k window in minutes), as an F16 GGUF. Each length:

- ``base`` (f16 cache, flash attention on, llama.cpp's protocol: the window's second half
  scored) and ``compare`` of the same GGUF with a q8_0 cache (``--kv-types`` at the longest
  length; each writes its JSON, depth table included, into --out for ``report --plots``),
  each a fresh process under every malloc policy of --policies; peak RSS from wait4(), beside
  the KV cache by llama.cpp's size formula (layers x tokens x (K + V width) x bytes);
- llama-perplexity (built as benchmarks/llamacpp_peer.py builds it) comparing the GGUF with
  that base file converted to its layout, with what its allocations need by its own source:
  the whole window's float32 logits (n_ctx x n_vocab x 4 bytes) and the scored half's uint16
  rows; its exit status and last line are printed as they come.

Every process runs in one cgroup with --limit-gib of memory (cgroup v1 or v2, where this
machine lets a process make one; otherwise the machine's own memory is the limit, and the
table says so). Appends dated rows to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from compare_peak_memory import ROOT
from results import append_row

sys.path.insert(0, str(ROOT / "tests"))

NAME = "llama3-128k"
CGROUP_V1 = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")


def memory_cgroup(limit: int) -> Path | None:
    """A fresh cgroup limited to ``limit`` bytes (its procs file), or None where none can be made."""
    name = f"kldtool-bench-{os.getpid()}"
    for root, knob in ((CGROUP_V1, "memory.limit_in_bytes"), (CGROUP_V2, "memory.max")):
        group = root / name
        try:
            group.mkdir(exist_ok=True)
            (group / knob).write_text(str(limit))
            if root == CGROUP_V1 and (group / "memory.memsw.limit_in_bytes").exists():
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
            return group / "cgroup.procs"
        except OSError:
            continue
    return None


def run_places(a) -> tuple[Path | None, str, Path, Path]:
    """The cgroup's procs file (or None), a phrase for where the runs ran, and the made --out and
    --work folders, for a phase's runs."""
    procs = memory_cgroup(int(a.limit_gib * 2**30))
    if procs is not None:
        # Removed at exit, a failed step's included (its processes have ended by then).
        atexit.register(_remove_group, procs.parent)
    where = f"a cgroup of {a.limit_gib:g} GiB" if procs else "no cgroup (the machine's own memory)"
    print(f"limit: {where}", flush=True)
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    return procs, where, out, work


def _remove_group(group: Path) -> None:
    with contextlib.suppress(OSError):  # a process still in it (a killed driver's child) keeps it
        group.rmdir()


def in_group(cmd: list[str], procs: Path | None) -> list[str]:
    if procs is None:
        return cmd
    return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *cmd]


def kv_bytes(n_tokens: int, cfg: dict, bytes_per: float = 2.0) -> float:
    """llama.cpp's KV cache for n tokens: layers x tokens x (K + V width) x bytes per element."""
    head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg["num_hidden_layers"] * n_tokens * 2 * cfg["num_key_value_heads"] * head * bytes_per


def peer_need(n_ctx: int, n_vocab: int) -> float:
    """What llama-perplexity's compare pass allocates for one window (tools/perplexity/perplexity.cpp,
    kl_divergence): the whole window's float32 logits and the scored half's uint16 base rows."""
    nv = 2 * ((n_vocab + 1) // 2) + 4
    return n_ctx * n_vocab * 4 + (n_ctx - 1 - n_ctx // 2) * nv * 2


def measured(cmd: list[str], procs, env: dict | None = None) -> tuple[int, float, float, str]:
    """(exit status, peak RSS MiB, wall s, its mean KLD line or last line) of one process in the cgroup."""
    t0 = time.time()
    p = subprocess.Popen(
        in_group(cmd, procs), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=os.environ | (env or {})
    )
    out = p.stdout.read().decode(errors="replace")  # before waiting: a child blocked on a full pipe never ends
    _, status, usage = os.wait4(p.pid, 0)
    lines = [x for x in out.splitlines() if x.strip()]
    # A finished compare's mean KLD, else the last thing the process said.
    last = next((x for x in lines if x.startswith("Mean    KLD")), (lines or ["-"])[-1])
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024, time.time() - t0, last[:160]


def run_peer(peer: Path, gguf: Path, raw_base: Path, n: int, procs) -> tuple[int, float, float, str]:
    """llama-perplexity comparing the GGUF with a base file in its own layout (kldtool's, converted)."""
    cmd = [str(peer), "-m", str(gguf), "--kl-divergence-base", str(raw_base), "--kl-divergence", "-c", str(n)]
    cmd += ["-b", "2048"]
    return measured(cmd + ["-t", str(os.cpu_count() or 2), "-fa", "on"], procs)


def llamacpp_phase(a, lengths: list[int]) -> None:
    from helpers.vocab_gguf import gguf_of
    from helpers.vocab_models import corpus, model_dir

    cfg = json.loads((model_dir(NAME) / "config.json").read_text())
    gguf, ids = gguf_of(NAME), corpus(NAME, ids=True)
    procs, where, out_dir, tmp = run_places(a)
    policies = a.policies.split(",")
    kv_types = a.kv_types.split(",")
    peer, peer_rows, rows = None, {}, {}
    if a.peer:
        from llamacpp_peer import build_peer

        peer = build_peer()
    for n in lengths:
        # The other policies at the shortest and longest lengths only, and KV types beyond the
        # first under the first policy: what the ratios and the KV comparison need.
        for policy in policies if n in (lengths[0], lengths[-1]) else policies[:1]:
            env = {"KLDTOOL_MALLOC": policy}
            base = tmp / f"base-{n}.kldt"
            flags = ["-m", str(gguf), "--flash-attn", "on"]
            b_usage, b_wall = kldtool_run(["base", *flags, "-f", str(ids), "--corpus-format", "ids", "-c", str(n),
                                        "--chunks", "1", "--kl-divergence-base", str(base)], env, procs)  # fmt: skip
            for kv in kv_types if (n, policy) == (lengths[-1], policies[0]) else kv_types[:1]:
                js = out_dir / f"kv-{kv}-{n // 1024}k-{policy}.json"
                c_usage, c_wall = kldtool_run(["compare", *flags, "--kv-cache-dtype", kv, "--kl-divergence-base",
                                            str(base), "--json", str(js)], env, procs)  # fmt: skip
                kld = json.loads(js.read_text())["statistics"]["kld_mean"]["value"]
                rows[n, policy, kv] = (b_usage, b_wall, c_usage, c_wall, kld)
                print(f"L={n:7d} {policy:5s} base {b_usage:8.0f} MiB {b_wall:7.1f} s | compare kv {kv:5s} "
                      f"{c_usage:8.0f} MiB {c_wall:7.1f} s, mean KLD {kld:.4g} | KV f16 cache "
                      f"{kv_bytes(n, cfg) / 2**20:6.0f} MiB", flush=True)  # fmt: skip
            if peer and policy == policies[0]:
                peer_rows[n] = _peer(a, peer, gguf, base, n, cfg, procs)
            base.unlink()
    _report(rows, peer_rows, lengths, policies, kv_types, cfg, where)


def kldtool_run(args: list[str], env: dict, procs) -> tuple[float, float]:
    rc, rss, wall, last = measured([sys.executable, "-m", "kldtool", *args], procs, env)
    if rc:
        raise SystemExit(f"kldtool {' '.join(args)} failed ({rc}): {last}")
    return rss, wall


def _peer(a, peer, gguf, base: Path, n: int, cfg, procs) -> tuple:
    """llama-perplexity's compare pass over ``base`` converted to its layout (which it needs whole)."""
    raw = base.with_suffix(".kld")
    subprocess.run([sys.executable, "-m", "kldtool", "convert", str(base), str(raw), "--to", "llamacpp"], check=True)
    try:
        rc, rss, wall, last = run_peer(peer, gguf, raw, n, procs)
    finally:
        raw.unlink(missing_ok=True)
    need = peer_need(n, cfg["vocab_size"]) / 2**30
    print(f"llama-perplexity L={n:7d}: exit {rc}, peak RSS {rss:8.0f} MiB, {wall:6.1f} s, its buffers "
          f"{need:6.1f} GiB; last line: {last}", flush=True)  # fmt: skip
    return rc, rss, wall, last, need


def _report(rows, peer_rows, lengths, policies, kv_types, cfg, where) -> None:
    lo, hi = lengths[0], lengths[-1]
    for policy in policies:
        kv = kv_types[0]
        net = {n: rows[n, policy, kv][0] - kv_bytes(n, cfg) / 2**20 for n in (lo, hi)}
        cnet = {n: rows[n, policy, kv][2] - kv_bytes(n, cfg, 34 / 32) / 2**20 for n in (lo, hi)}
        figures = ", ".join(
            f"{n // 1024}k base {rows[n, policy, kv][0]:.0f} MiB {rows[n, policy, kv][1]:.0f} s / compare "
            f"{rows[n, policy, kv][2]:.0f} MiB {rows[n, policy, kv][3]:.0f} s"
            for n in lengths
        )
        append_row(
            f"llama.cpp one long window, peak RSS (llama3-128k F16 GGUF, V=128,256, FA on; KLDTOOL_MALLOC={policy}; {where})",
            figures,
            f"{hi // 1024}k/{lo // 1024}k less the KV cache: base {net[hi] / net[lo]:.2f}, compare {cnet[hi] / cnet[lo]:.2f}",
        )
    klds = {kv: rows[hi, policies[0], kv][4] for kv in kv_types}
    append_row(
        f"KV-cache types at {hi:,} tokens against the f16-cache base (llama3-128k F16 GGUF, FA on)",
        ", ".join(f"{kv} mean KLD {v:.3g} ({rows[hi, policies[0], kv][3]:.0f} s)" for kv, v in klds.items()),
        " < ".join(sorted(klds, key=klds.get)),
    )
    if peer_rows:
        append_row(
            f"llama-perplexity --kl-divergence, one window (llama3-128k F16 GGUF; {where})",
            ", ".join(
                f"{n // 1024}k exit {rc} peak {rss:.0f} MiB (its buffers {need:.1f} GiB)"
                for n, (rc, rss, _, _, need) in peer_rows.items()
            ),
            "; ".join(f"{n // 1024}k: {last}" for n, (_, _, _, last, _) in peer_rows.items() if peer_rows[n][0]),
        )
