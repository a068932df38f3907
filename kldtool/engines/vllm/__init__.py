"""vLLM: the offline engine (offline.py), the served client (served.py), their flags
(options.py), and the hook they use inside vLLM's workers (worker.py; plugin.py installs it in a
server's). seam/ is the one package that touches vLLM; wire.py the request format both sides
share, and all a client needs; policy.py what a server's operator allows the hook to read and
write."""

from kldtool.engines.contract import HIDDEN, SAMPLES, SCORES
from kldtool.engines.registry import EngineEntry

ENTRIES = (
    EngineEntry(
        name="vllm",
        engine="kldtool.engines.vllm.offline:VllmEngine",
        can=frozenset({HIDDEN, SAMPLES, SCORES}),
        options="kldtool.engines.vllm.options:VllmOptions",
    ),
    EngineEntry(
        name="vllm-server",
        engine="kldtool.engines.vllm.served:VllmServerEngine",
        can=frozenset({HIDDEN, SAMPLES, SCORES}),
        options="kldtool.engines.vllm.options:ServedOptions",
        also_takes=("logits_block",),
        selected_by=("server", "exchange_dir"),
        with_engine=("vllm",),
        server_side=("dtype", "device"),
        server_side_of=("vllm",),
        server_note=" (give them to `vllm serve`), not kldtool's with --server",
        listed=False,
        served=True,
        reads_base_there=True,
    ),
)
