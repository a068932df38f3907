"""Audits of served models (``compare --generated --json``) side by side: read and checked to
be comparable (one base model, one set of prompts), ranked by their KL(served‖base), and two of
them paired prompt by prompt (``diff``): the same prompts answered by two providers, so a
prompt that is hard for one is hard for the other and the difference is known better than
either estimate."""

from __future__ import annotations

import json

import numpy as np

from kldtool.errors import UsageError
from kldtool.stats.bootstrap import BATCH, Bootstrap, resample_weights

KIND = "served-audit"  # pipeline/served_audit.py writes it as the result's "kldtool"


def is_audit(path: str) -> bool:
    """Whether ``path`` is an audit's --json result (a cheap look at a .json file)."""
    if not path.endswith(".json"):
        return False
    try:
        with open(path, "rb") as f:
            return json.loads(f.read(64 << 20)).get("kldtool") == KIND
    except (OSError, ValueError, AttributeError):
        return False


def read_audits(paths: list[str]) -> list[dict]:
    """Each audit with its ``label`` (the served model's name at its server); audits of other base
    models or other prompts are refused in one line."""
    out = []
    for path in paths:
        with open(path, "rb") as f:
            r = json.loads(f.read(64 << 20))
        if r.get("kldtool") != KIND or not isinstance(r.get("per_sample"), list):
            raise UsageError(f"{path}: not a compare --generated --json result")
        if out:
            for key in ("base_model", "prompts"):
                if r.get(key) != out[0].get(key):
                    raise UsageError(f"{path}: its {key} differs from {out[0]['path']}'s: not one audit's providers")
        served = r.get("served") if isinstance(r.get("served"), dict) else {}
        model, server = served.get("model") or {}, served.get("server") or {}
        r["label"] = f"{model.get('model', '?')} at {server.get('url', '?')}"
        r["path"] = path
        out.append(r)
    return out


def ranked(audits: list[dict]) -> list[dict]:
    """Closest to the base first."""
    return sorted(audits, key=lambda r: r["reverse_kld"]["value"])


def _by_prompt(r: dict) -> dict[int, np.ndarray]:
    out: dict[int, np.ndarray] = {}
    for s in r["per_sample"]:
        out[s["prompt"]] = out.get(s["prompt"], np.zeros(2)) + (s["sum"], s["tokens"])
    return out


def paired(a: dict, b: dict, spec: Bootstrap) -> dict:
    """KL(served‖base) of A minus B's over the prompts both answered, with an interval from
    resampling prompts (both providers' answers to a prompt drawn together)."""
    pa, pb = _by_prompt(a), _by_prompt(b)
    prompts = sorted(set(pa) & set(pb))
    if len(prompts) < 2:
        raise UsageError(f"{a['path']} and {b['path']}: fewer than two prompts answered by both")
    m = np.array([[*pa[p], *pb[p]] for p in prompts])  # sum_a, tokens_a, sum_b, tokens_b

    def diff(sums: np.ndarray) -> np.ndarray:
        return sums[..., 0] / sums[..., 1] - sums[..., 2] / sums[..., 3]

    rng, draws = np.random.default_rng(spec.seed), []
    for start in range(0, spec.resamples, BATCH):
        size = min(BATCH, spec.resamples - start)
        draws.append(diff(resample_weights(rng.integers(0, len(m), size=(size, len(m))), len(m)) @ m))
    x = np.concatenate(draws) if draws else np.zeros(0)
    lo, hi = np.percentile(x, [2.5, 97.5]) if len(x) else (np.nan, np.nan)
    whole = m.sum(axis=0)
    return {
        "kldtool": "served-audit-diff",
        "a": {"label": a["label"], "path": a["path"], "value": float(whole[0] / whole[1])},
        "b": {"label": b["label"], "path": b["path"], "value": float(whole[2] / whole[3])},
        "difference": float(diff(whole)),
        "standard_error": float(np.std(x, ddof=1)) if len(x) > 1 else None,
        "interval_95": [float(lo), float(hi)],
        "significant": bool(len(x) and (lo > 0 or hi < 0)),
        "prompts": len(prompts),
        "a_lower": int(np.sum(m[:, 0] / m[:, 1] < m[:, 2] / m[:, 3])),
    }
