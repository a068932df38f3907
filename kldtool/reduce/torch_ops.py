"""The reducer as eager torch ops, for any device: the portable fallback and the reference
the compiled backends are checked against (float32 terms, float64 sums, first-index argmax)."""

from __future__ import annotations

from kldtool.reduce.records import TokenRecords, to_records
from kldtool.reduce.rowmath import extras_block, prepare, row_blocks


def reduce_rows_torch(logits, base_rows, targets, clamped_at: float) -> TokenRecords:
    import torch

    n_vocab = logits.shape[1]
    out = [_reduce_block(lg, rows, t, n_vocab, clamped_at) for lg, rows, t in row_blocks(logits, base_rows, targets)]
    return to_records({k: torch.cat([o[k] for o in out]).cpu().numpy() for k in out[0]})


def _reduce_block(logits, rows, targets, n_vocab, clamped_at):
    import torch

    logits, big_m, imax, b = prepare(logits, rows, n_vocab)
    tcol = targets[:, None]
    nll = big_m - logits.gather(1, tcol)[:, 0]
    nll_base = -b.gather(1, tcol)[:, 0]
    terms = torch.exp(b) * ((b - logits) + big_m[:, None])
    kld = torch.where(b > clamped_at, terms, torch.zeros_like(terms)).sum(dim=1, dtype=torch.float64)
    dp = torch.exp(-nll) - torch.exp(-nll_base)
    extras = extras_block(logits, big_m, b, clamped_at)
    return {
        "nll": nll,
        "nll_base": nll_base,
        "kld": kld,
        "dp": dp,
        "same_top": imax == extras["top1_base"],
        **extras,
    }
