"""The flag groups several commands share, defined once (options.flags adds a group to a
command; options.py turns each group's values into an engine, a protocol, a corpus or a
bootstrap)."""

from __future__ import annotations

from typing import Optional

import typer

from kldtool.cli.engine_flags import engine_help
from kldtool.engines import registry

MODEL_HELP = (
    "Model: a .gguf file (llamacpp), a checkpoint directory, a hub id (org/name, from the Hugging Face cache; "
    "org/name:file.gguf for a GGUF in it). Default: the built-in SmolLM2-135M."
)
ModelOpt = typer.Option(None, "-m", "--model", help=MODEL_HELP)

# name: (type, option); the names are the builders' keywords.
ENGINE = {
    "engine": (
        Optional[str],
        typer.Option(None, "--engine", help=engine_help()),
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
    **registry.all_flags(),  # every engine's own flags, in the registry's order
}

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
            help="text, lines (a document per line), jsonl, dir, tokens (token strings), ids or generated "
            "(default: from -f; a corpus of kldtool generate is known by its header).",
        ),
    ),
    "text_field": (str, typer.Option("text", "--text-field", help="jsonl: the field that holds a document's text.")),
    "score": (
        Optional[str],
        typer.Option(
            None,
            "--score",
            help="A corpus of kldtool generate: generated (the default: the answers' positions only) or all.",
        ),
    ),
}

SCORING = {
    "protocol": (
        Optional[str],
        typer.Option(
            None,
            "--protocol",
            help="llamacpp (chunks of -c, second half scored; the default), exl3 "
            "(windows of -c every --stride, all positions), stride "
            "(Hugging Face's: each token once), documents (--lengths; the default for a corpus of "
            "kldtool generate) or rolling (lm-eval's loglikelihood_rolling).",
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
