"""Where a quant goes wrong (``kldtool worst RESULT.h5``; report/worst.py prints it). The N scored positions with the
largest KLD (``--by dp``: largest |Δp|, ``--by nll``: largest rise in the target's NLL over the
base's; ``--by routing``: the positions whose MoE routing departs from the base's earliest in
the network, larger KLD first among equals), each with the text before it, the target, both models' top-1 tokens and both models'
probability of the target; ``--by window``: the chunks ranked by mean KLD.

The tokens come from the base file the per-token file names (``--base`` if it moved); token
texts from a tokenizer: ``-m``, else the base file's model, else the compared model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from kldtool.errors import UsageError

BY = ("kld", "dp", "nll", "routing", "window")


@dataclass
class Decoder:
    """Token ids to text, through the model's own tokenizer (a GGUF's or a transformers
    directory's), loaded without its weights by the engine that reads such a model."""

    source: str

    def __post_init__(self):
        from kldtool.engines import registry

        if registry.recognise(self.source) == "llamacpp":  # a GGUF: its own vocabulary
            from kldtool.engines.llamacpp.load import vocab_decoder
        else:
            from kldtool.engines.hf_tokenizer import vocab_decoder
        self.piece = vocab_decoder(self.source)

    def text(self, ids) -> str:
        return self.piece(ids) if len(ids) else ""


def tokenizer_source(explicit: str | None, base_meta: dict, run: dict) -> str:
    for candidate in (explicit, (base_meta.get("model") or {}).get("model"), (run.get("model") or {}).get("model")):
        if candidate and os.path.exists(candidate):
            return candidate
    raise UsageError(
        "worst: no tokenizer at hand (the base file's and the compared model's paths are gone); give -m MODEL"
    )


def _order(cols: dict, by: str) -> np.ndarray:
    if by == "routing":
        if "routing_first" not in cols:
            raise UsageError("--by routing: this per-token file has no routing (its compare run compared none)")
        departed = np.flatnonzero(cols["routing_first"] >= 0)
        return departed[np.lexsort((-cols["kld"][departed], cols["routing_first"][departed]))]
    if by == "kld":
        key = cols["kld"]
    elif by == "dp":
        key = np.abs(cols["dp"])
    else:
        key = cols["nll_q"].astype(np.float64) - cols["nll_base"]
    return np.argsort(-key, kind="stable")


def worst_tokens(cols: dict, tokens: np.ndarray, decode: Decoder, n: int, by: str, context: int) -> list[dict]:
    out = []
    for i in _order(cols, by)[:n]:
        pos = int(cols["position"][i])
        row = {
            "chunk": int(cols["chunk"][i]),
            "position": pos,
            "kld": float(cols["kld"][i]),
            "dp": float(cols["dp"][i]),
            "nll_q": float(cols["nll_q"][i]),
            "nll_base": float(cols["nll_base"][i]),
            "p_q": float(np.exp(-cols["nll_q"][i])),
            "p_base": float(np.exp(-cols["nll_base"][i])),
            "target_id": int(cols["target"][i]),
            "top1_q_id": int(cols["top1_q"][i]),
            "top1_base_id": int(cols["top1_base"][i]),
        }
        if "routing_first" in cols:
            row["first_departing_layer"] = int(cols["routing_first"][i])
            row["layers_flipped"] = int(cols["routing_flipped"][i])
        row["context"] = decode.text(tokens[max(0, pos - context) : pos])
        for k in ("target", "top1_q", "top1_base"):
            row[k] = decode.text([row[f"{k}_id"]]) if row[f"{k}_id"] >= 0 else "?"
        out.append(row)
    return out


def rank_windows(cols: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(chunk ids, each token's index into them, tokens per chunk, mean KLD per chunk, chunk
    indices from the largest mean KLD down)."""
    ids, at = np.unique(cols["chunk"], return_inverse=True)
    count = np.bincount(at)
    mean = np.bincount(at, weights=cols["kld"].astype(np.float64)) / count
    return ids, at, count, mean, np.argsort(-mean, kind="stable")


def worst_windows(cols: dict, tokens: np.ndarray, decode: Decoder, n: int, context: int) -> list[dict]:
    ids, at, count, mean, order = rank_windows(cols)
    first = np.array([int(cols["position"][np.argmax(cols["chunk"] == c)]) for c in ids])
    return [
        {
            "chunk": int(ids[j]),
            "kld_mean": float(mean[j]),
            "tokens": int(count[j]),
            "same_top": float(np.mean(cols["same_top"][at == j])),
            "text": decode.text(tokens[first[j] : first[j] + context]),
        }
        for j in order[:n]
    ]


def base_tokens(run: dict, base: str | None, result: str) -> tuple[np.ndarray, dict, dict[int, int]]:
    """The token stream, metadata and window starts (window -> stream offset) of the base file a
    per-token run was compared against (``base``, if it moved), checked to be that very file."""
    from kldtool.provenance.identity import base_identity
    from kldtool.logitsfile import open_base_file
    from kldtool.text.protocols import stored_windows

    path = base or run.get("base_path")
    if not path or not os.path.exists(path):
        raise UsageError(f"{result}: its base file {path} is not there; give --base FILE")
    reader = open_base_file(path)
    try:
        if base_identity(reader) != run.get("base"):
            raise UsageError(f"{path}: not the base file {result} was compared against (header or tokens differ)")
        starts = {w.index: w.start for w in stored_windows(reader.tokens, reader.header, None)}
        return np.asarray(reader.tokens), reader.metadata or {}, starts
    finally:
        reader.close()


def rank_worst(
    result: str, n: int = 20, by: str = "kld", context: int = 12, base: str | None = None, model: str | None = None
) -> list[dict]:
    """The rows ``kldtool worst`` shows: the ``n`` positions (or windows, ``by="window"``) of a
    per-token file where the quant departs most, with their text."""
    from kldtool.analysis.per_token import read_per_token

    if by not in BY:
        raise UsageError(f"--by {by!r}: expected one of {', '.join(BY)}")
    if n < 1 or context < 0:
        raise UsageError(f"-n {n} --context {context}: need at least 1 row and 0 or more context tokens")
    run, cols = read_per_token(result)
    tokens, meta, _ = base_tokens(run, base, result)
    decode = Decoder(tokenizer_source(model, meta, run))
    if by == "window":
        return worst_windows(cols, tokens, decode, n, context)
    return worst_tokens(cols, tokens, decode, n, by, context)


@dataclass(kw_only=True)
class TokenView:
    """One scored position of a window as the HTML report shows it."""

    text: str
    kld: float
    target: str
    p_base: float
    p_q: float
    top1_base: str
    top1_q: str


def window_views(result: str, windows: int) -> list[tuple[int, float, list[TokenView]]]:
    """(chunk, mean KLD, its scored positions) of the ``windows`` chunks of a per-token file with
    the largest mean KLD, token texts from the base file's tokens and the model's tokenizer."""
    from kldtool.analysis.per_token import read_per_token

    run, cols = read_per_token(result)
    tokens, meta, _ = base_tokens(run, None, result)
    decode = Decoder(tokenizer_source(None, meta, run))
    ids, at, _, mean, order = rank_windows(cols)

    def piece(k: str, i: int) -> str:
        return decode.text([int(cols[k][i])]) if cols[k][i] >= 0 else "?"

    return [
        (
            int(ids[j]),
            float(mean[j]),
            [
                TokenView(
                    text=decode.text([int(tokens[cols["position"][i]])]),
                    kld=float(cols["kld"][i]),
                    target=piece("target", i),
                    p_base=float(np.exp(-cols["nll_base"][i])),
                    p_q=float(np.exp(-cols["nll_q"][i])),
                    top1_base=piece("top1_base", i),
                    top1_q=piece("top1_q", i),
                )
                for i in np.flatnonzero(at == j)
            ],
        )
        for j in order[:windows]
    ]
