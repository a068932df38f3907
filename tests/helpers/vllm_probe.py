"""Scores a base file's windows through kldtool's hook; asks vLLM itself for the same positions'
target log-probs with ``prompt_logprobs=0`` and scores the windows again with the hook's logits
in blocks of 16 rows (each unless told not to); and scores one window of LONG tokens in blocks
of 128 rows and in blocks of LONG rows (the whole window at once, up to the 1 GiB of logits the
hook holds).
tests/helpers/vllm_jobs.py runs it on the engine its commands of the same weights and dtype
share.
"""

import numpy as np


def probe(engine, base: str, long_n: int = 0, text: str | None = None, blocks: bool = True, own: bool = True) -> dict:
    """The summaries of ``engine`` (a VllmEngine) on ``base``; its logits block is left as found.
    ``blocks``: also score in blocks of 16 rows; ``own``: also ask vLLM for its prompt logprobs
    (each a pass over every window)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from kldtool.logitsfile import open_base_file
    from kldtool.text.protocols import llamacpp_windows

    reader = open_base_file(base)
    h = reader.header
    windows = llamacpp_windows(reader.tokens, h.n_ctx, h.n_chunk, engine.bos_id)
    records = engine.score(windows, engine.rows_source(reader, list(range(h.n_chunk))))
    default_block = engine.logits_block
    block_diff = None
    if blocks:
        engine.logits_block = 16
        blocked = engine.score(windows, engine.rows_source(reader, list(range(h.n_chunk))))
        block_diff = {
            f: float(
                max(np.abs(getattr(a, f).astype(np.float64) - getattr(b, f)).max() for a, b in zip(records, blocked))
            )
            for f in ("nll", "kld")
        }
    logprob_diff = None
    if own:
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in w.tokens]) for w in windows]
        outs = engine.llm.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        diffs = []
        for w, got, rec in zip(windows, outs, records):
            span = range(w.first, w.first + w.n_scored)
            theirs = np.array([got.prompt_logprobs[p + 1][int(w.tokens[p + 1])].logprob for p in span], np.float64)
            diffs.append(np.abs(-rec.nll.astype(np.float64) - theirs))
        logprob_diff = float(np.concatenate(diffs).max())
    kld = np.concatenate([r.kld for r in records])
    out = {
        "tokens": int(sum(len(r) for r in records)),
        "max_abs_logprob_diff": logprob_diff,
        "mean_kld": float(kld.mean()),
        "hooks": engine.hooks,
        "default_block": default_block,
        "block_16_max_diff": block_diff,
    }
    if long_n:
        from kldtool.text.protocols import Window

        ids = engine.tokenize(open(text, "rb").read())[:long_n]
        w = Window(index=0, tokens=ids, first=0, targets=ids[1:].astype(np.int64))
        runs = {}
        for block in (128, long_n):  # 128 rows, or as much of a step as the hook holds at once
            engine.logits_block = block
            runs[block] = engine.nll([w])[0].astype(np.float64)
        out["long"] = {
            "tokens": len(runs[128]),
            "max_nll_diff": float(np.abs(runs[128] - runs[long_n]).max()),
            "ppl": float(np.exp(runs[128].mean())),
        }
    engine.logits_block = default_block
    reader.close()
    return out
