"""vLLM: the offline engine (offline.py), the served client (served.py), their flags
(options.py), and the hook they use inside vLLM's workers (worker.py; plugin.py installs it in a
server's). seam/ is the one package that touches vLLM; wire.py the request format both sides
share, and all a client needs; policy.py what a server's operator allows the hook to read and
write."""

from kldtool.engines.contract import HIDDEN, SAMPLES, SCORES
from kldtool.engines.registry import EngineEntry, Server

ENTRIES = (
    EngineEntry(
        name="vllm",
        engine="kldtool.engines.vllm.offline:VllmEngine",
        options="kldtool.engines.vllm.options:VllmOptions",
        can=frozenset({HIDDEN, SAMPLES, SCORES}),
    ),
    EngineEntry(
        name="vllm-server",
        engine="kldtool.engines.vllm.served:VllmServerEngine",
        options="kldtool.engines.vllm.options:ServedOptions",
        can=frozenset({HIDDEN, SAMPLES, SCORES}),
        server=Server(
            flags=("server", "exchange_dir"),
            with_engine=("vllm",),
            settings=("dtype", "device"),
            settings_of=("vllm",),
            note=" (give them to `vllm serve`), not kldtool's with --server",
            reads_base_there=True,
        ),
    ),
)
