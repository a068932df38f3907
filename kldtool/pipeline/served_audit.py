"""``compare --generated CORPUS --kl-divergence-base BASE``: what a served model is, from its
own sampled answers (``generate --endpoint``) and the base model's rows over the same tokens
(``base -f CORPUS``), with no request sent: the unbiased KL(served‖base) with its interval, the
sampling check that says whether the estimator holds, and whether the server counted the
prompts as rendered here (stats/served_kl.py says how).

The base file must be the corpus's: its windows are matched to the corpus's samples one by one,
token for token, and any difference refuses the run in one line."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from kldtool.analysis.served_runs import KIND
from kldtool.codec.rows import HEADER_SLOTS, row_params_np
from kldtool.errors import BaseFileError, MismatchError, UsageError
from kldtool.logitsfile import open_base_file
from kldtool.logitsfile.atomic import output_target
from kldtool.logitsfile.prefetch import PrefetchedChunks
from kldtool.reduce.quant_topk import reduce_quant_topk
from kldtool.runtime.small_files import write_json
from kldtool.stats.bootstrap import Bootstrap
from kldtool.stats.served_kl import Sample, reverse_kld, sampling_check
from kldtool.text.generated import read_generated
from kldtool.text.protocols import stored_windows


BOUNDS = ("kld", "rkld", "tv", "tv_hi")  # reduce/quant_topk.py's bounded records kept


def sampled_rank(top_ids: np.ndarray, top: np.ndarray, token: int) -> int:
    """The sampled token's 0-based rank in a position's served top K; K where it is outside a
    complete top K of sure ids; -1 where the top K is not complete or names an entry no id is
    sure of (decided before the token is looked at, so leaving it out biases nothing)."""
    if not (top_ids >= 0).all() or np.isnan(top).any():
        return -1
    hit = np.flatnonzero(top_ids == token)
    return int(hit[0]) if len(hit) else len(top_ids)


def _base_side(feed, w, h, served: dict) -> tuple[np.ndarray, np.ndarray, dict]:
    """The base's log-prob of each scored target of window ``w`` (decoded as every reader
    decodes a row), whether the row held it at its clamp (a floor, not the value), and the
    bounds the served top K give of the full divergences at each position (reduce/quant_topk.py,
    as compare --endpoint computes them): KLD(base‖served) and reverse KLD from below, the total
    variation between two bounds."""
    lps, clamped, bounds, a = [], [], [], 0
    for rows in feed.parts_numpy(w.index, 0, w.n_scored):
        b = a + len(rows)
        t = w.targets[a:b]
        if (t >= h.n_vocab).any():
            raise BaseFileError(f"window {w.index}: a target outside the base file's vocabulary")
        scale, low = row_params_np(rows)
        code = rows[np.arange(len(rows)), HEADER_SLOTS + t].astype(np.float32)
        lps.append((code * scale + low).astype(np.float64))
        clamped.append(code == 0)
        known = ~np.isnan(served["top"][a:b])  # an entry the server did not name: unknown, outside S
        ids, lq = np.where(known, served["ids"][a:b], -1), np.where(known, served["top"][a:b], 0.0)
        rec = reduce_quant_topk(rows, h.n_vocab, h.clamped_at, ids, lq, served["own"][a:b], t)
        bounds.append({k: getattr(rec, k) for k in BOUNDS})
        a = b
    joined = {k: np.concatenate([x[k] for x in bounds]) for k in BOUNDS}
    return np.concatenate(lps), np.concatenate(clamped), joined


def _samples(corpus: str, samples: list[dict], base: str, reader) -> tuple[list[Sample], dict]:
    served = [s for s in samples if "served" in s]
    if len(served) != len(samples):
        raise UsageError(
            f"--generated {corpus}: its samples hold no served log-probs (written by generate --endpoint?)"
        )
    h = reader.header
    if h.keep:
        raise UsageError(f"{base}: a top-{h.keep} base file; the estimate needs the base's full rows")
    windows = stored_windows(reader.tokens, h, None)
    scored = [s for s in samples if len(s["ids"])]
    if not scored:
        raise UsageError(f"--generated {corpus}: no answer holds a token")
    if len(windows) != len(scored):
        raise MismatchError(
            f"{base}: {len(windows)} windows for the {len(scored)} answers of {corpus}: not its base file"
        )
    out, bounds = [], []
    feed = PrefetchedChunks(reader, range(len(windows)), device="cpu")
    try:
        for w, s in zip(windows, scored):
            doc = np.concatenate([s["prompt_ids"], s["ids"]])
            same = len(w.tokens) <= len(doc) and np.array_equal(w.tokens, doc[: len(w.tokens)])
            if not same or w.first != len(s["prompt_ids"]) - 1:
                raise MismatchError(
                    f"{base}: window {w.index} is not sample {s['sample']} of prompt {s['prompt']} of {corpus}"
                )
            n = w.n_scored
            v = s["served"]
            k = v["top_ids"].shape[1]
            # The top K - 1 only: a server may name the sampled token in place of the K-th where it
            # lies outside the top K (vLLM's chat API does), and the first K - 1 are the true top
            # K - 1 either way.
            ids, top = v["top_ids"][:n, : max(k - 1, 1)], v["top_logprobs"][:n, : max(k - 1, 1)]
            lp, clamped, b = _base_side(feed, w, h, {"ids": ids, "top": top, "own": v["logprobs"][:n]})
            ranks = np.array([sampled_rank(ids[t], top[t], int(s["ids"][t])) for t in range(n)])
            out.append(Sample(served=v["logprobs"][:n], base=lp, clamped=clamped, top=top, rank=ranks))
            bounds.append(b)
    finally:
        feed.close()
    return out, {k: np.concatenate([b[k] for b in bounds]) for k in BOUNDS}


def _prompts(samples: list[dict]) -> dict:
    counted = [(s["served"]["prompt_tokens"], len(s["prompt_ids"])) for s in samples]
    known = [(a, b) for a, b in counted if a is not None]
    differ = [(a, b) for a, b in known if a != b]
    return {
        "samples": len(samples),
        "counted_by_server": len(known),
        "agree": len(known) - len(differ),
        "differ": len(differ),
        "first_difference": {"server": differ[0][0], "rendered_here": differ[0][1]} if differ else None,
    }


def lines(result: dict) -> list[str]:
    r, c, p = result["reverse_kld"], result["sampling_check"], result["prompt_tokens"]
    se = f" ± {r['standard_error']:.6f}" if r["standard_error"] is not None else ""
    ci = f", 95 % [{r['interval_95'][0]:.6f}, {r['interval_95'][1]:.6f}]" if r["interval_95"] else ""
    out = [
        f"KL(served‖base) = {r['value']:.6f}{se}{ci}: unbiased, the mean of log q(x) - log p(x) over "
        f"{r['tokens']} sampled tokens in {r['samples']} samples"
    ]
    b = result["bounds"]
    out.append(
        f"  from the top K over the same positions: KLD(base‖served) ≥ {b['kld_at_least']:.6f}, "
        f"reverse KLD ≥ {b['rkld_at_least']:.6f}, total variation in [{b['tv_interval'][0]:.6f}, "
        f"{b['tv_interval'][1]:.6f}] (bounds, as compare --endpoint prints them)"
    )
    if r["interval_95"] and b["rkld_at_least"] > r["interval_95"][1]:
        out.append(
            "  the reverse KLD's bound lies above the estimate's interval: chance (1 in 40 at most) or "
            "samples and log-probs that are not what the server reports them to be"
        )
    if r["clamped_tokens"]:
        out.append(
            f"  {r['clamped_tokens']} sampled tokens lay at the base row's clamp, where log p is a floor: "
            "the estimate is low there"
        )
    asked = result["served"]["sampling"] or {}
    plain = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
    if any(asked.get(k) != v for k, v in plain.items()):
        shown = ", ".join(f"{k} {asked.get(k)}" for k in plain)
        out.append(f"  the corpus was sampled with {shown}: the mean is then not KL(served‖base)")
    if c["passes"] is None:
        out.append("sampling check: no position with a complete top K of known ids; not checked")
    else:
        top1 = c["bins"][0]
        verdict = "passes" if c["passes"] else "FAILS: the server does not sample at temperature 1 untruncated"
        out.append(
            f"sampling check: {verdict} (top-1 taken at {100 * top1['observed_share']:.1f} % of positions, "
            f"{100 * top1['expected_share']:.1f} % reported; largest |z| {c['max_abs_z']:.1f} of "
            f"{len(c['bins'])} rank bins, limit {c['z_limit']:g}, {c['positions']} positions)"
        )
    if p["counted_by_server"] == 0:
        out.append("prompt tokens: the server counted none")
    elif p["differ"]:
        d = p["first_difference"]
        out.append(
            f"prompt tokens: the server counted other numbers than the prompts rendered here in {p['differ']} of "
            f"{p['counted_by_server']} samples (first: {d['server']} against {d['rendered_here']}): it measured "
            "its model on another prompt (a system prompt or a template of its own)"
        )
    else:
        out.append(f"prompt tokens: the server's counts equal the prompts rendered here in all {p['agree']} samples")
    return out


def _columns(raw: list[dict], samples: list[Sample], bounds: dict) -> dict[str, np.ndarray]:
    """--per-token's columns, one row per sampled position (analysis/served_per_token.py)."""
    scored = [s for s in raw if len(s["ids"])]
    n = [len(x.served) for x in samples]

    def each(f):
        return np.concatenate([f(s, x, k) for s, x, k in zip(scored, samples, n)])

    return {
        "prompt": each(lambda s, x, k: np.full(k, s["prompt"], np.int64)),
        "sample": each(lambda s, x, k: np.full(k, s["sample"], np.int64)),
        "depth": each(lambda s, x, k: np.arange(k, dtype=np.int64)),
        "token": each(lambda s, x, k: s["ids"][:k]),
        "served_logprob": each(lambda s, x, k: x.served),
        "base_logprob": each(lambda s, x, k: x.base),
        "difference": each(lambda s, x, k: x.served - x.base),
        "clamped": each(lambda s, x, k: x.clamped),
        "rank": each(lambda s, x, k: x.rank),
        **{f"{name}_bound": bounds[name] for name in BOUNDS},
    }


def run_served_audit(
    corpus: str, base: str, json_path: str | None, bootstrap: Bootstrap, per_token: str | None = None
) -> dict:
    if not os.path.exists(corpus):
        raise UsageError(f"--generated {corpus}: no such file")
    if per_token:
        output_target(per_token)  # a place that cannot be written is refused before the work
    head, raw = read_generated(corpus)  # the corpus checked whole before the base file is opened
    reader = open_base_file(base)
    try:
        samples, bounds = _samples(corpus, raw, base, reader)
        base_model = (reader.metadata.get("model") or {}).get("model")
    finally:
        reader.close()
    result = {
        "kldtool": KIND,
        "generated": os.path.abspath(corpus),
        "base_file": os.path.abspath(base),
        "base_model": base_model,
        "prompts": head.get("prompts"),
        "served": {
            "engine": head.get("engine"),
            "model": head.get("model"),
            "server": head.get("server"),
            "sampling": head.get("sampling"),
        },
        "reverse_kld": reverse_kld(samples, bootstrap),
        "sampling_check": sampling_check(samples),
        "bounds": {  # from the served top K against the base's full rows: labelled, not estimates
            "kld_at_least": float(bounds["kld"].mean()),
            "rkld_at_least": float(bounds["rkld"].mean()),
            "tv_interval": [float(bounds["tv"].mean()), float(bounds["tv_hi"].mean())],
            "positions": len(bounds["kld"]),
        },
        "prompt_tokens": _prompts(raw),
        "finishes": {f: sum(s["finish"] == f for s in raw) for f in ("stop", "length", "cut")},
        # each answer's own sum and tokens: `diff` pairs two providers' answers by prompt
        "per_sample": [
            {
                "prompt": s["prompt"],
                "sample": s["sample"],
                "sum": float(np.sum(x.served - x.base)),
                "tokens": len(x.served),
            }
            for s, x in zip((s for s in raw if len(s["ids"])), samples)
        ],
    }
    for line in lines(result):
        print(line)
    sys.stdout.flush()
    if per_token:
        from kldtool.analysis.served_per_token import write_served_per_token

        run = {k: result[k] for k in ("generated", "base_file", "served")}
        write_served_per_token(per_token, _columns(raw, samples, bounds), run)
    if json_path:
        write_json(json_path, json.loads(json.dumps(result)))
    return result
