"""Cost of ``kldtool compare --server`` on top of what a served model's own API offers.

One vLLM OpenAI server (the built-in SmolLM2, started here with kldtool's plugin, dtype from
--dtype) answers the windows of a base file twice per round, in alternating order: (a) the
plain client a notebook would write, each window a completion with ``prompt_logprobs=0`` (the
target log-prob of every prompt position, as JSON), sent together from a thread pool, and (b)
kldtool's full compare pipeline through ``--server`` (the hook reduces in the server's worker
against the base rows; records come back through the exchange directory; statistics are
accumulated and printed). Server and client start-up are excluded. Prints the best time of each
and their ratio, and appends a dated row to benchmarks/RESULTS.md. The server's one worker runs
inside its engine core's process (tests/helpers/vllm_serve.py; since 2026-11-27, after the
figures in docs/benchmarks.md, which had it in a process of its own).

    .venv/bin/python benchmarks/vllm_served_overhead.py [--ctx 512] [--chunks 40] [--dtype bfloat16] [--rounds 2]
"""

from __future__ import annotations

from base_fixture import report, served_with_plugin, time_both, vllm_args


def main() -> None:
    a = vllm_args(__doc__)
    with served_with_plugin(a) as s:
        best = time_both(s.plain, s.engine, s.reader, a.rounds)
    report(
        a,
        best,
        "served prompt_logprobs=0",
        "kldtool compare --server",
        "vLLM served compare vs the server's prompt_logprobs=0",
    )


if __name__ == "__main__":
    main()
