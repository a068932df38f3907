"""``kldtool generate``: a model's own answers to prompts, as a corpus that ``base -f`` scores
(text/generated.py). Every prompt is rendered and tokenized, and checked against the model's
context, before the first sample is drawn; each sample's seed is derived from the run's seed and
the sample's place (prompt, sample), so a run and its rerun give the same corpus on one engine,
whatever else ran between them. An engine that batches (vLLM) takes its samples_per_call at once,
in the corpus's order."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import numpy as np

from kldtool import __version__
from kldtool.analysis.degeneration import degeneration, degeneration_line
from kldtool.engines import registry
from kldtool.engines.contract import SAMPLES, Sampling, description
from kldtool.errors import UsageError
from kldtool.pipeline.sinks import Sinks
from kldtool.provenance.identity import model_identity, tokenizer_identity
from kldtool.runtime.progress import Progress
from kldtool.text.chat import ChatTemplate
from kldtool.text.generated import CorpusWriter
from kldtool.text.prompts import read_prompts


@dataclass(kw_only=True, frozen=True)
class GenerateJob:
    out_path: str
    sampling: Sampling
    prompts: str | None = None  # a prompts file; None: the built-in set
    num_prompts: int | None = None  # the first N prompts only
    samples: int = 1  # answers per prompt
    seed: int = 0
    chat_template: str | None = None  # a template file in place of the model's
    resume: bool = False  # go on from an interrupted run's partial corpus


def sample_seed(seed: int, prompt: int, sample: int) -> int:
    """The seed of one sample: a function of the run's seed and its place only."""
    return int(np.random.SeedSequence([seed, prompt, sample]).generate_state(1)[0])


def _template(engine, path: str | None) -> ChatTemplate | None:
    if path is None:
        return engine.chat_template()
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read(1 << 20)
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--chat-template {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    base = engine.chat_template()
    return ChatTemplate(source, base.special if base else {}, path)


def _prompt_ids(engine, job: GenerateJob, prompts, template) -> list[np.ndarray]:
    """Every prompt's ids, checked to leave room for --max-tokens in the model's context."""
    # vLLM's max_model_len (offline or a server's) may be shorter than the model's trained context.
    limit = min((n for n in (engine.facts.n_ctx_train, getattr(engine, "max_model_len", None)) if n), default=None)
    out = []
    for p in prompts.items:
        where = f"{prompts.name}: line {p.line}"
        if p.is_chat:
            if template is None:
                raise UsageError(
                    f"{where}: a chat prompt, and {engine.facts.model} has no chat template (--chat-template FILE)"
                )
            ids = engine.tokenize_rendered(template.render(list(p.messages), where))
        else:
            ids = np.asarray(engine.tokenize(p.text.encode("utf-8")), dtype=np.int64)
        if limit and len(ids) + job.sampling.max_tokens > limit:
            raise UsageError(
                f"--max-tokens {job.sampling.max_tokens}: {where} has {len(ids)} prompt tokens, and with "
                f"{job.sampling.max_tokens} new ones it passes the model's context of {limit}"
            )
        out.append(ids)
    return out


def check_can_sample(name: str, can: bool) -> None:
    """A usage error naming the engines that sample, where ``name`` does not (``can``)."""
    if not can:
        raise UsageError(
            f"generate: the {name} engine does not sample answers (the {registry.named_with(SAMPLES)} engines do)"
        )


def check_sampling(s: Sampling, samples: int) -> None:
    if s.temperature < 0 or not 0 < s.top_p <= 1 or s.top_k < 0 or not 0 <= s.min_p < 1:
        raise UsageError(
            f"sampling: --temperature {s.temperature} (>= 0), --top-p {s.top_p} (0 < p <= 1), "
            f"--top-k {s.top_k} (>= 0), --min-p {s.min_p} (0 <= p < 1)"
        )
    if s.max_tokens < 1 or samples < 1:
        raise UsageError(f"--max-tokens {s.max_tokens} and --samples {samples}: each at least 1")


def _kept(writer: CorpusWriter, places: list, ids: list[np.ndarray], sinks: Sinks) -> list[dict]:
    """A resumed run's samples, checked to be the first of this run's places, prompts and seeds."""
    kept = writer.kept
    for n, s in enumerate(kept):
        mine = n < len(places) and (s["prompt"], s["sample"], s["seed"]) == places[n]
        if not mine or not np.array_equal(s["prompt_ids"], ids[places[n][0]]):
            writer.stop()
            raise UsageError(f"--resume: {writer.tmp}: line {n + 2} is not this run's sample {n + 1}; remove it")
    if kept:
        sinks.info(f"generate: resuming after {len(kept)} of {len(places)} samples in {writer.tmp}")
    return kept


def run_generate(engine, job: GenerateJob, sinks: Sinks | None = None) -> dict:
    sinks = sinks or Sinks()
    check_can_sample(engine.facts.name, registry.has(engine, SAMPLES))
    check_sampling(job.sampling, job.samples)
    prompts = read_prompts(job.prompts, job.num_prompts)
    template = _template(engine, job.chat_template)
    ids = _prompt_ids(engine, job, prompts, template)
    header = {
        "engine": engine.facts.name,
        "model": model_identity(description(engine.facts)),
        "tokenizer": tokenizer_identity(engine),
        "sampling": asdict(job.sampling) | {"samples": job.samples, "seed": job.seed},
        "prompts": {"name": prompts.name, "sha256": prompts.sha256, "count": len(prompts.items)},
        "chat_template": {"from": template.where, "sha256": template.sha256} if template else None,
        "kldtool_version": __version__,
    }
    served_from = getattr(engine, "served_from", None)  # a served model's answers with their log-probs
    if served_from is not None:
        header["server"] = served_from()
    places = [(i, j, sample_seed(job.seed, i, j)) for i in range(len(ids)) for j in range(job.samples)]
    step = max(engine.samples_per_call, 1)
    writer = CorpusWriter(job.out_path, header, job.resume)
    kept = _kept(writer, places, ids, sinks)
    answers, finishes = [s["ids"] for s in kept], [s["finish"] for s in kept]
    try:
        with Progress("generate", len(places) - len(kept), "samples") as shown:
            for at in range(len(kept), len(places), step):
                part = places[at : at + step]
                asked = ([ids[i] for i, _, _ in part], job.sampling, [seed for _, _, seed in part])
                if getattr(engine, "wants_prompts", False):  # a server's chat API takes the messages
                    got = engine.sample(*asked, sources=[prompts.items[i] for i, _, _ in part])
                else:
                    got = engine.sample(*asked)
                for (i, j, seed), (new, finish, *served) in zip(part, got, strict=True):
                    writer.add(i, j, seed, ids[i], new, finish, *served)
                    answers.append(new)
                    finishes.append(finish)
                    shown.advance(tokens=len(new))
        writer.finish()
    except BaseException:
        writer.stop()  # what was written stays in the partial file, for --resume
        raise
    figures = degeneration(answers, finishes)
    sinks.info(f"generate: {os.path.basename(job.out_path)}: {degeneration_line(figures)}")
    differ = getattr(engine, "differ", 0)
    if differ:
        server, here = engine.first_difference
        sinks.info(
            f"generate: {engine.url} counted other prompt tokens than the prompts rendered here in {differ} samples "
            f"(first: {server} against {here}): a system prompt or a template of its own measures another prompt"
        )
    return {"corpus": os.path.abspath(job.out_path), **header, "degeneration": figures}
