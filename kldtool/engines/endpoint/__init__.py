"""The endpoint engine: any OpenAI-compatible server that returns prompt log-probs, with
nothing of kldtool's on it (engine.py), through a client that behaves on a shared server
(client.py); its flags (options.py). Its KLD is a lower bound; docs/endpoint.md says what is
exact and why."""

from kldtool.engines.contract import BOUNDED, SAMPLES, SCORES
from kldtool.engines.registry import EngineEntry, Server

ENTRIES = (
    EngineEntry(
        name="endpoint",
        engine="kldtool.engines.endpoint.engine:EndpointEngine",
        options="kldtool.engines.endpoint.options:EndpointOptions",
        can=frozenset({SCORES, BOUNDED, SAMPLES}),
        server=Server(
            flags=("endpoint",),
            settings=("dtype", "device", "threads"),
            settings_of=("vllm",),
            note=", not kldtool's with --endpoint",
        ),
    ),
)
