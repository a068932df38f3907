"""Simple figures of how a model's own answers degenerate (``kldtool generate``, ``report``): the
share that ran into the token limit, their mean length, distinct-2 (the corpus's distinct
bigrams over all its bigrams) and the repeated 4-gram rate (per answer, the share of its
4-grams already seen earlier in it; averaged over answers). A quant that falls into loops hits
the limit more often, repeats more and varies less."""

from __future__ import annotations

import numpy as np


def _ngrams(ids: np.ndarray, n: int) -> list[tuple]:
    return [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]


def degeneration(answers: list[np.ndarray], finishes: list[str]) -> dict:
    bigrams = [g for ids in answers for g in _ngrams(ids, 2)]
    repeats = []
    for ids in answers:
        grams = _ngrams(ids, 4)
        if grams:
            repeats.append(1 - len(set(grams)) / len(grams))
    return {
        "samples": len(answers),
        "at_limit": float(np.mean([f == "length" for f in finishes])) if finishes else 0.0,
        "mean_length": float(np.mean([len(a) for a in answers])) if answers else 0.0,
        "distinct_2": len(set(bigrams)) / len(bigrams) if bigrams else 0.0,
        "repeated_4gram": float(np.mean(repeats)) if repeats else 0.0,
    }


def degeneration_line(d: dict) -> str:
    return (
        f"{d['samples']} samples: {100 * d['at_limit']:.1f} % hit --max-tokens, mean length "
        f"{d['mean_length']:.1f} tokens, distinct-2 {d['distinct_2']:.3f}, repeated 4-grams "
        f"{100 * d['repeated_4gram']:.1f} %"
    )
