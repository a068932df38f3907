"""Where in a run the divergence is: its scored tokens split into buckets, by depth (the predicted
token's position in its window, in compare's own depth buckets: stats/depth.py) or by kind of
token (whitespace, digits, code-like, punctuation, word start, word continuation, other; plus
classes the user names by a regex over the token's text or a file of token ids), each bucket
with the run's own statistics.

A bucket's statistics come from the same per-chunk vectors the whole run's do (its tokens
through ``per_token.accumulate``, window by window), so its mean KLD,
same top p and RMS Δp are the run's formulas and its interval is the run's chunk block
bootstrap, the windows resampled whole. The built-in buckets of either split partition the
tokens: their counts add up to the run's, and their KLD sums to the run's.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

import numpy as np

from kldtool.errors import UsageError
from kldtool.analysis.per_token import accumulate
from kldtool.stats.bootstrap import Bootstrap, block_bootstrap, chunk_statistics
from kldtool.stats.depth import default_bounds, labels
from kldtool.stats.summary import percentile

KINDS = ("whitespace", "digits", "code-like", "punctuation", "word start", "word continuation", "other")
# Characters that rarely appear in prose but often in code (a token holding one is code-like).
CODE_CHARS = set("{}[]<>=;_\\|&^~$#@`*/")


def kind_of(text: str) -> str:
    """The built-in kind of one token's text (the first that fits, in the order of KINDS)."""
    stripped = text.strip()
    if not stripped:
        return "whitespace"
    if stripped.isdigit():
        return "digits"
    if any(c in CODE_CHARS for c in stripped) or re.search(r"[a-z][A-Z]", stripped):
        return "code-like"
    if all(unicodedata.category(c)[0] in "PS" for c in stripped):
        return "punctuation"
    if stripped[0].isalpha():
        return "word start" if text[0].isspace() else "word continuation"
    return "other"


@dataclass(frozen=True)
class UserClass:
    name: str
    pattern: re.Pattern | None = None
    ids: frozenset | None = None


def parse_class(spec: str) -> UserClass:
    """``NAME=REGEX`` (searched in each token's text) or ``NAME=@FILE`` (token ids, whitespace-separated)."""
    name, sep, what = spec.partition("=")
    if not sep or not name.strip() or not what:
        raise UsageError(f"--class {spec}: expected NAME=REGEX or NAME=@FILE (a file of token ids)")
    if what.startswith("@"):
        try:
            with open(what[1:], encoding="utf-8") as f:
                ids = frozenset(int(t) for t in f.read().split())
        except OSError as e:
            raise UsageError(f"--class {spec}: cannot read {what[1:]} ({e.strerror})") from None
        except ValueError as e:
            raise UsageError(f"--class {spec}: {what[1:]} holds something other than token ids ({e})") from None
        return UserClass(name.strip(), ids=ids)
    try:
        return UserClass(name.strip(), pattern=re.compile(what))
    except re.error as e:
        raise UsageError(f"--class {spec}: not a regular expression ({e})") from None


def bucket_stats(cols: dict, mask: np.ndarray, spec: Bootstrap) -> dict:
    """One bucket's statistics from the per-token columns of its tokens (``mask``)."""
    n = int(mask.sum())
    if n == 0:
        return {"tokens": 0, "share": 0.0}
    # The bucket's tokens of each window, added window by window as the run's accumulator was.
    acc = accumulate([{k: v[mask] for k, v in cols.items()}], "a bucket")
    vectors = np.asarray(acc.chunk_vectors)
    whole = chunk_statistics(acc.total)
    out = {
        "tokens": n,
        "share": n / len(mask),
        "windows": len(acc.chunks),
        "kld_sum": acc.sums["kld"],
        "kld_mean": float(whole["kld_mean"]),
        "kld_p99": float(percentile(np.sort(cols["kld"][mask]), 0.99)),  # llama.cpp's percentile
        "same_top_p": float(whole["same_top_p"]),
        "rms_dp": float(whole["rms_dp"]),
    }
    boot = block_bootstrap(vectors, spec)
    if boot:
        out["kld_mean_interval_95"] = boot["kld_mean"]["interval_95"]
    return out


def by_depth(cols: dict, starts: dict[int, int], spec: Bootstrap) -> list[dict]:
    """Buckets of the predicted token's position in its window (``starts``: window -> stream offset)."""
    start = np.array([starts[int(c)] for c in cols["chunk"]], np.int64)
    depth = cols["position"].astype(np.int64) - start
    bounds = default_bounds(int(depth.min()), int(depth.max()))  # compare's own table's buckets
    which = np.searchsorted(bounds, depth, side="right") - 1
    rows = [{"bucket": label} | bucket_stats(cols, which == i, spec) for i, label in enumerate(labels(bounds))]
    return [r for r in rows if r["tokens"]]


def by_kind(cols: dict, text_of, classes: list[UserClass], spec: Bootstrap) -> list[dict]:
    """The built-in kinds (a partition), then each user class (tokens matching it)."""
    ids = np.unique(cols["target"])
    texts = {int(i): text_of(int(i)) for i in ids}
    kinds = {i: kind_of(t) for i, t in texts.items()}
    target = cols["target"]
    rows = [
        {"bucket": k} | bucket_stats(cols, np.isin(target, [i for i in ids if kinds[int(i)] == k]), spec) for k in KINDS
    ]
    rows = [r for r in rows if r["tokens"]]
    for c in classes:
        members = [
            i for i in ids if (c.ids is not None and int(i) in c.ids) or (c.pattern and c.pattern.search(texts[int(i)]))
        ]
        rows.append({"bucket": c.name, "user_class": True} | bucket_stats(cols, np.isin(target, members), spec))
    return rows


BY = ("depth", "kind")


def breakdown(
    result: str | list[str],
    by: str,
    classes: list[UserClass] = (),
    base: str | None = None,
    model: str | None = None,
    spec: Bootstrap = Bootstrap(),
) -> dict:
    """A per-token file's statistics split ``by`` depth or kind, as ``worst --by`` prints them
    (several files: shards of one run against one base file, their tokens pooled)."""
    from kldtool.analysis.per_token import read_per_token
    from kldtool.analysis.worst import Decoder, base_tokens, tokenizer_source

    paths = [result] if isinstance(result, str) else list(result)
    parts = [read_per_token(p) for p in paths]
    run = parts[0][0]
    cols = {k: np.concatenate([c[k] for _, c in parts]) for k in parts[0][1]}
    _, meta, starts = base_tokens(run, base, paths[0])
    if by == "depth":
        rows = by_depth(cols, starts, spec)
    else:
        decode = Decoder(tokenizer_source(model, meta, run))
        rows = by_kind(cols, lambda i: decode.text([i]), list(classes), spec)
    return {
        "kind": "kldtool-breakdown",
        "result": " + ".join(paths),
        "by": by,
        "tokens": len(cols["kld"]),
        "rows": rows,
    }
