"""The flag groups several commands share, defined once (options.flags adds a group to a
command; options.py turns each group's values into an engine, a protocol, a corpus or a
bootstrap)."""

from __future__ import annotations

from typing import Optional

import typer

from kldtool.cli.endpoint_flags import ENDPOINT

MODEL_HELP = (
    "Model: a .gguf file (llamacpp), a checkpoint directory, a hub id (org/name, from the Hugging Face cache; "
    "org/name:file.gguf for a GGUF in it). Default: the built-in SmolLM2-135M."
)
ModelOpt = typer.Option(None, "-m", "--model", help=MODEL_HELP)

# name: (type, option); the names are the builders' keywords.
ENGINE = {
    "engine": (
        Optional[str],
        typer.Option(
            None,
            "--engine",
            help="transformers, llamacpp, vllm, python or xlstm (default: from the model path; .gguf -> "
            "llamacpp, a helibrunna run -> xlstm).",
        ),
    ),
    "revision": (
        Optional[str],
        typer.Option(None, "--revision", help="With a hub id: its branch, tag or commit (default main)."),
    ),
    "gguf_file": (
        Optional[str],
        typer.Option(None, "--gguf-file", help="With a hub id: the GGUF file in it to run (llamacpp)."),
    ),
    "dtype": (
        Optional[str],
        typer.Option(None, "--dtype", help="transformers: float32 (default), bfloat16 or float16."),
    ),
    "device": (
        Optional[str],
        typer.Option(None, "--device", help="transformers and xlstm: cpu (default), cuda, cuda:N."),
    ),
    "threads": (Optional[int], typer.Option(None, "-t", "--threads", help="CPU threads (default: all cores).")),
    "batch": (
        int,
        typer.Option(
            2048,
            "-b",
            "--batch-size",
            help="Tokens per engine call; chunks are batched as llama-perplexity's n_seq = batch / ctx.",
        ),
    ),
    "contexts": (
        Optional[int],
        typer.Option(
            None,
            "--contexts",
            help="llamacpp, compare and ppl: contexts decoding different "
            "batches at once, the threads split among them "
            "(default 2 with 2+ threads; 1 is llama-"
            "perplexity's layout). The numbers do not change.",
        ),
    ),
    "flash_attn": (
        Optional[str],
        typer.Option(
            None,
            "--flash-attn",
            help="llamacpp: auto (default, as llama-perplexity: on for this CPU), on or off (its -fa). "
            "Flash attention keeps parts of attention in f16: ~1e-4 nats of NLL.",
        ),
    ),
    "tensor_parallel_size": (
        Optional[int],
        typer.Option(None, "--tensor-parallel-size", help="vLLM: tensor-parallel ranks."),
    ),
    "pipeline_parallel_size": (
        Optional[int],
        typer.Option(None, "--pipeline-parallel-size", help="vLLM: pipeline stages (the last computes logits)."),
    ),
    "gpu_memory_utilization": (
        Optional[float],
        typer.Option(None, "--gpu-memory-utilization", help="vLLM: memory share it may reserve (CPU default 0.3)."),
    ),
    "max_model_len": (
        Optional[int],
        typer.Option(None, "--max-model-len", help="vLLM: context length (default: the window + 1)."),
    ),
    "quantization": (
        Optional[str],
        typer.Option(None, "--quantization", help="vLLM: quantization method (default: from the checkpoint)."),
    ),
    "kv_cache_dtype": (
        Optional[str],
        typer.Option(
            None,
            "--kv-cache-dtype",
            help="vLLM: KV-cache dtype (its names). llamacpp: K and V cache type, f16 (default, as "
            "llama-perplexity), f32, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0 or q5_1 (its -ctk/-ctv).",
        ),
    ),
    "logits_block": (
        Optional[int],
        typer.Option(
            None,
            "--logits-block",
            min=1,
            help="vLLM: scored rows whose logits the hook computes at once "
            "(default: 256 MiB of them, e.g. 682 rows of a 49k vocab).",
        ),
    ),
    "enforce_eager": (bool, typer.Option(False, "--enforce-eager", help="vLLM: no CUDA graphs / compilation.")),
    "trust_remote_code": (bool, typer.Option(False, "--trust-remote-code", help="vLLM: allow the model's own code.")),
    "vllm_arg": (
        Optional[list[str]],
        typer.Option(None, "--vllm-arg", help="vLLM: any other LLM(...) argument, KEY=VALUE (repeatable)."),
    ),
    "server": (
        Optional[str],
        typer.Option(
            None,
            "--server",
            help="vLLM: score on a running `vllm serve` (URL) started "
            "with KLDTOOL_VLLM_HOOK=1; -m then names its "
            "tokenizer's directory if the server's is not here.",
        ),
    ),
    "exchange_dir": (
        Optional[str],
        typer.Option(
            None,
            "--exchange-dir",
            help="--server: a directory the server's "
            "workers write results to and this "
            "machine reads (default: a temporary one, "
            "for a server on this machine).",
        ),
    ),
    **ENDPOINT,
}
VLLM_KEYS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
    "quantization",
    "kv_cache_dtype",
    "logits_block",
    "enforce_eager",
    "trust_remote_code",
)

CORPUS = {
    "file": (
        Optional[str],
        typer.Option(None, "-f", "--file", help="Corpus (default: Python's built-in pydoc topics)."),
    ),
    "corpus_format": (
        str,
        typer.Option(
            "auto",
            "--corpus-format",
            help="text, lines (a document per line), jsonl, dir, tokens (token strings) or ids (default: from -f).",
        ),
    ),
    "text_field": (str, typer.Option("text", "--text-field", help="jsonl: the field that holds a document's text.")),
}

SCORING = {
    "protocol": (
        str,
        typer.Option(
            "llamacpp",
            "--protocol",
            help="llamacpp (chunks of -c, second half scored), exl3 "
            "(windows of -c every --stride, all positions), stride "
            "(Hugging Face's: each token once), documents (--lengths) "
            "or rolling (lm-eval's loglikelihood_rolling).",
        ),
    ),
    "ctx_size": (
        Optional[int],
        typer.Option(
            None,
            "-c",
            "--ctx-size",
            help="llamacpp chunk / exl3, stride window (512); rolling window (the model's context).",
        ),
    ),
    "stride": (
        Optional[int],
        typer.Option(None, "--stride", help="exl3/stride: tokens between window starts (default: -c / 4)."),
    ),
    "lengths": (
        Optional[str],
        typer.Option(None, "--lengths", help="documents: N,N,... first-N-token lengths (default: whole documents)."),
    ),
    "full_length_only": (
        bool,
        typer.Option(
            False,
            "--full-length-only",
            help="documents: count a document at N only if it has N tokens (default: a shorter one counts whole).",
        ),
    ),
    "prefix_token": (
        Optional[int],
        typer.Option(
            None, "--prefix-token", help="rolling: the token id before each document (default: BOS, else EOS)."
        ),
    ),
    "chunks": (Optional[int], typer.Option(None, "--chunks", help="Use at most this many chunks (windows).")),
    "force": (bool, typer.Option(False, "--force", help="Run windows longer than the model's trained context.")),
}

FRAME_ROWS = typer.Option(
    None,
    "--frame-rows",
    help="kldtool format: rows per stored frame (default: about 8 MiB "
    "of rows; 0: one frame per window, the layout before frames).",
)

BOOTSTRAP = {
    "resamples": (
        int,
        typer.Option(1000, "--bootstrap", help="Block-bootstrap resamples over chunks for the error bars (0: none)."),
    ),
    "seed": (int, typer.Option(0, "--seed", help="Seed of the bootstrap's resampling.")),
}

PROGRESS = {
    "progress": (
        Optional[str],
        typer.Option(
            None,
            "--progress",
            help="How stderr shows a run's progress: auto (default: a live bar on a terminal, a plain line "
            "every few seconds otherwise), bar, lines or none (also KLDTOOL_PROGRESS).",
        ),
    ),
}
