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

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from base_fixture import base_reader, report, time_both, vllm_args

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    a = vllm_args(__doc__)

    from helpers.vllm_serve import operator_env, served

    from kldtool.engines.vllm.served import MAX_IN_FLIGHT, VllmServerEngine
    from kldtool.protocols import llamacpp_windows

    with base_reader(a) as (model, reader, tmp):
        h = reader.header
        # The operator allows the base file's directory and a results directory beside it.
        exchange = Path(tmp) / "exchange"
        exchange.mkdir()
        operator = operator_env([Path(reader.path).parent], exchange)
        with served(model, tmp, h.n_ctx + 1, dtype=a.dtype, operator=operator) as url:
            engine = VllmServerEngine(
                url, n_ctx=h.n_ctx, windows_per_call=max(4, 65536 // h.n_ctx), exchange_dir=str(exchange)
            )
            windows = llamacpp_windows(reader.tokens, h.n_ctx, h.n_chunk, engine.bos_id)

            def one(w) -> None:
                r = engine._request(
                    "/v1/completions",
                    {
                        "model": engine.model_id,
                        "prompt": [int(t) for t in w.tokens],
                        "max_tokens": 1,
                        "prompt_logprobs": 0,
                    },
                )
                assert len(r["choices"][0]["prompt_logprobs"]) == len(w.tokens)

            def plain() -> None:
                with ThreadPoolExecutor(max_workers=min(len(windows), MAX_IN_FLIGHT)) as pool:
                    list(pool.map(one, windows))

            best = time_both(plain, engine, reader, a.rounds)
            engine.close()
    report(
        a,
        best,
        "served prompt_logprobs=0",
        "kldtool compare --server",
        "vLLM served compare vs the server's prompt_logprobs=0",
    )


if __name__ == "__main__":
    main()
