"""vLLM: the offline engine (offline.py), the served client (served.py), their flags
(options.py), and the hook they use inside vLLM's workers (worker.py; plugin.py installs it in a
server's). seam/ is the one package that touches vLLM; wire.py the request format both sides
share, and all a client needs; policy.py what a server's operator allows the hook to read and
write."""

from kldtool.engines.contract import HIDDEN, SCORES
from kldtool.engines.registry import EngineEntry

ENTRIES = (
    EngineEntry(
        "vllm",
        "kldtool.engines.vllm.offline:VllmEngine",
        "a checkpoint directory or hub id, in vLLM",
        can=frozenset({HIDDEN, SCORES}),
        options="kldtool.engines.vllm.options:VllmOptions",
        takes=(
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "gpu_memory_utilization",
            "max_model_len",
            "quantization",
            "kv_cache_dtype",
            "logits_block",
            "enforce_eager",
            "trust_remote_code",
            "vllm_arg",
        ),
    ),
    EngineEntry(
        "vllm-server",
        "kldtool.engines.vllm.served:VllmServerEngine",
        "a running `vllm serve` with kldtool's plugin",
        can=frozenset({HIDDEN, SCORES}),
        options="kldtool.engines.vllm.options:ServedOptions",
        takes=("exchange_dir", "logits_block"),
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
