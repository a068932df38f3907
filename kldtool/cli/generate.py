"""``generate``: a model's own answers to prompts (chat messages rendered with its template, or
raw text), a corpus that ``base -f`` scores on the answers' positions."""

from __future__ import annotations

from typing import Optional

import typer

from kldtool.cli.app import app
from kldtool.cli.flag_groups import ENGINE, PROGRESS, ModelOpt
from kldtool.cli.options import flags, open_engine
from kldtool.errors import UsageError
from kldtool.runtime.progress import choose as choose_progress

# Every engine flag but those of scoring runs only (tokens per call, llama.cpp's scoring lanes,
# vLLM's logits blocks) and an endpoint's log-prob count, whose --top-k is the sampler's here.
RUN = {k: v for k, v in ENGINE.items() if k not in ("batch", "contexts", "logits_block", "top_k")}


@app.command()
@flags(engine_flags=RUN, display=PROGRESS)
def generate(
    model: Optional[str] = ModelOpt,
    out: Optional[str] = typer.Option(None, "-o", "--output", help="The corpus to write (JSONL)."),
    prompts: Optional[str] = typer.Option(
        None, "--prompts", help='A JSONL of prompts: {"messages": [...]} or {"prompt": ...} a line (default: builtin).'
    ),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", help="Use only the first N prompts."),
    samples: int = typer.Option(1, "-n", "--samples", help="Answers per prompt."),
    temperature: float = typer.Option(1.0, "--temperature", help="0: greedy."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling (1: off)."),
    top_k: int = typer.Option(0, "--top-k", help="Sample among the K most probable tokens (0: off)."),
    min_p: float = typer.Option(
        0.0, "--min-p", help="Drop tokens below this share of the top one's probability (0: off)."
    ),
    max_tokens: int = typer.Option(256, "--max-tokens", help="New tokens per answer at most."),
    seed: int = typer.Option(0, "--seed", help="The run's seed; each sample's is derived from it and its place."),
    chat_template: Optional[str] = typer.Option(
        None, "--chat-template", help="A Jinja chat template file in place of the model's own."
    ),
    top_logprobs: Optional[int] = typer.Option(
        None,
        "--top-logprobs",
        help="--endpoint: log-probs asked per generated token, 1-20 (default 20): kept for `compare --generated`.",
    ),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the run's settings and figures here."),
    resume: bool = typer.Option(
        False, "--resume", help="Go on from an interrupted run of the same command (its FILE.partial)."
    ),
    engine_flags=None,
    display=None,
):
    """Sample a model's own answers to prompts into a corpus for `base -f` (scored on the answers)."""
    choose_progress(display.progress)
    if out is None:
        raise UsageError("generate needs -o FILE (the corpus to write)")
    from kldtool.engines import registry
    from kldtool.engines.contract import SAMPLES, Sampling
    from kldtool.pipeline.generate import GenerateJob, check_can_sample, check_sampling, run_generate
    from kldtool.runtime.small_files import write_json

    chosen = registry.entry_for(vars(engine_flags), model)
    check_can_sample(chosen.name, SAMPLES in chosen.can)  # before any engine starts

    job = GenerateJob(
        out_path=out,
        sampling=Sampling(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, max_tokens=max_tokens),
        prompts=prompts,
        num_prompts=num_prompts,
        samples=samples,
        seed=seed,
        chat_template=chat_template,
        resume=resume,
    )
    check_sampling(job.sampling, job.samples)
    eng = open_engine(engine_flags, model, 0, sampling=True, top_logprobs=top_logprobs)
    try:
        result = run_generate(eng, job)
    finally:
        eng.close()
    if json_out:
        write_json(json_out, result)
