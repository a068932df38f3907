"""Score mode (``kldtool ppl``): a model's perplexity under any protocol, with no base file.

Every scored position's NLL comes from the full-vocabulary normalisation of the actual next
token, as phase 1 computes it, so ``ppl --protocol llamacpp`` prints what llama-perplexity
prints. Text corpora scored once per token also get lm-eval's bits per byte, byte and word
perplexity; ``documents`` runs get one line per length. Targets equal to the engine's pad id
(a python engine's ``pad_id``, the xlstm engine's [PAD]) are not scored.
"""

from __future__ import annotations

import math
import time
from contextlib import closing

import numpy as np

from kldtool.engines.contract import Engine, description, label
from kldtool.pipeline import engine_modes
from kldtool.text.corpus import Corpus
from kldtool.pipeline.sinks import Sinks
from kldtool.runtime.progress import Progress
from kldtool.pipeline.batching import groups
from kldtool.provenance.manifest import run_manifest, run_metadata
from kldtool.pipeline.plan import counts_at, make_plan
from kldtool.pipeline.ppl_job import PplJob
from kldtool.report.console import final_estimate, ppl_progress
from kldtool.stats import PplAccumulator


def length_line(n: int, row: dict, full_only: bool) -> str:
    ppl = f"{row['ppl']:.4f} +/- {row['ppl_uncertainty']:.5f}" if row["tokens"] else "n/a"
    shorter = "skipped" if full_only else "counted whole"
    return (
        f"length {n:6d}: PPL = {ppl}  ({row['tokens']} tokens, {row['documents_used']} documents, "
        f"{row['documents_shorter']} shorter than {n}: {shorter})"
    )


def evaluation_fields(acc: PplAccumulator, used: int, skipped: int, n: int) -> dict:
    """One length's result under the names music-model evaluations write (Museformer's
    protocol): PPL = exp(total NLL / scored tokens), infinity once the mean NLL reaches 100."""
    avg = acc.nll / acc.count if acc.count else float("nan")
    return {
        "perplexity": math.exp(avg) if avg < 100 else math.inf,
        "avg_nll": avg,
        "total_tokens": acc.count,
        "num_sequences": used,
        "skipped_sequences": skipped,
        "max_context": n,
    }


def text_measures(nll_sum: float, size: dict) -> dict:
    """lm-eval's definitions: word and byte perplexity, bits per byte, from the summed NLL (nats)."""
    return {
        "bytes": size["bytes"],
        "words": size["words"],
        "word_perplexity": math.exp(nll_sum / size["words"]),
        "byte_perplexity": math.exp(nll_sum / size["bytes"]),
        "bits_per_byte": nll_sum / size["bytes"] / math.log(2),
    }


def _length_rows(per_length: dict, plan, sinks: Sinks) -> list[dict]:
    """The documents protocol's PPL at each length, each printed as it is made."""
    rows = []
    for n, acc in per_length.items():
        counts = plan.documents["per_length"][str(n)]
        est = acc.estimate() if acc.count else (float("nan"), float("nan"))
        rows.append(
            {
                "length": n,
                "ppl": est[0],
                "ppl_uncertainty": est[1],
                "tokens": acc.count,
                "documents_used": counts["used"],
                "documents_shorter": counts["shorter"],
            }
            | evaluation_fields(acc, counts["used"], counts["skipped"], n)
        )
        sinks.info(length_line(n, rows[-1], plan.protocol.full_only))
    return rows


def run_ppl(engine: Engine, corpus: Corpus, job: PplJob, sinks: Sinks | None = None) -> dict:
    run = PplRun(engine, corpus, job, sinks or Sinks())
    run.start()
    run.loop()
    return run.result()


class PplRun:
    """A ppl run in compare's three steps: ``start`` (the plan and the engine's schedule),
    ``loop`` (each window's NLLs into the accumulators, a line each) and ``result``."""

    def __init__(self, engine: Engine, corpus: Corpus, job: PplJob, sinks: Sinks):
        self.engine, self.corpus, self.job, self.sinks = engine, corpus, job, sinks
        self.t0 = time.time()

    def start(self) -> None:
        engine, protocol = self.engine, self.job.protocol
        self.plan = plan = make_plan(engine, self.corpus, protocol, self.job.chunks, self.job.force)
        self.schedule = engine_modes.schedule(engine, list(groups(plan.windows, engine.windows_per_call(plan.n_ctx))))
        self.sinks.info(
            f"ppl: protocol {protocol.name}, {len(plan.windows)} windows of up to {plan.n_ctx} tokens "
            f"({plan.n_source_tokens} tokens in {self.corpus.name}), engine {label(engine)}{self.schedule.note}"
        )
        self.total = PplAccumulator()
        self.per_length = {n: PplAccumulator() for n in protocol.lengths}
        self.masked = 0

    def loop(self) -> None:
        pad, plan, total = self.engine.facts.pad_id, self.plan, self.total
        with closing(engine_modes.nlls(self.schedule)) as scored, Progress("ppl", len(plan.windows)) as shown:
            for group, nlls in scored:
                for w, nll in zip(group, nlls):
                    keep = np.asarray(w.targets) != pad if pad is not None else None
                    self.masked += 0 if keep is None else int((~keep).sum())
                    total.add(nll if keep is None else nll[keep])
                    for n, acc in self.per_length.items():
                        if counts_at(plan.protocol, w, n):
                            acc.add(nll[: n - 1] if keep is None else nll[: n - 1][keep[: n - 1]])
                    self.sinks.out(ppl_progress(w.index + 1, total.ppl))
                    shown.advance(tokens=len(nll))
        self.sinks.line()

    def result(self) -> dict:
        engine, plan, total, sinks = self.engine, self.plan, self.total, self.sinks
        value, unc = total.estimate()
        sinks.info(final_estimate(value, unc))
        result = run_metadata("ppl") | {
            "protocol": plan.describe(engine.facts.bos_id),
            "corpus": {"path": self.corpus.name, "format": self.corpus.format},
            "model": description(engine.facts),
            "manifest": run_manifest(engine),
            "ppl": value,
            "ppl_uncertainty": unc,
            "ln_ppl": total.nll / total.count,
            "nll_sum": total.nll,
            "scored_tokens": total.count,
            "windows": len(plan.windows),
        }
        if engine.facts.pad_id is not None:
            result["pad_id"], result["masked_tokens"] = engine.facts.pad_id, self.masked
        if self.per_length:
            result["per_length"] = _length_rows(self.per_length, plan, sinks)
        if plan.text_size:
            result["text"] = t = text_measures(total.nll, plan.text_size)
            sinks.info(
                f"bits per byte = {t['bits_per_byte']:.5f}, byte perplexity = {t['byte_perplexity']:.5f}, "
                f"word perplexity = {t['word_perplexity']:.4f} ({t['bytes']} bytes, {t['words']} words)"
            )
        result["wall_time_s"] = round(time.time() - self.t0, 3)
        return result
