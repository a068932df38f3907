"""``kldtool recipe``'s results (OUT/recipe.json) read back for ``report``: each checked whole
before anything is drawn (a file another process wrote is not trusted: numbers finite and in
range, the frontier's sizes rising, the proof's verdicts agreeing with their intervals), and
several recipes shown together only where they priced the same source on the same windows."""

from __future__ import annotations

import json
import math

from kldtool.errors import UsageError

KIND = "recipe"  # recipe/run.py writes it as the result's "kldtool"
MAX_BYTES = 64 << 20


def verdict(low: float, high: float) -> str:
    """The recipe against a mix from the 95 % interval of recipe - mix."""
    return "lower" if high < 0 else "higher" if low > 0 else "not different"


def is_recipe(path: str) -> bool:
    """Whether ``path`` is a recipe's result (a cheap look at a .json file)."""
    if not path.endswith(".json"):
        return False
    try:
        with open(path, "rb") as f:
            return json.loads(f.read(MAX_BYTES)).get("kldtool") == KIND
    except (OSError, ValueError, AttributeError):
        return False


class _Check:
    """One file's checks, each failure one line naming the file and the field."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, where: str, what: str):
        raise UsageError(f"{self.path}: {where} {what}")

    def number(self, d: dict, key: str, where: str, low: float = 0.0) -> float:
        v = d.get(key) if isinstance(d, dict) else None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < low:
            self.fail(f"{where}.{key}", f"is {v!r}, not a finite number >= {low:g}")
        return float(v)

    def count(self, d: dict, key: str, where: str) -> int:
        v = d.get(key) if isinstance(d, dict) else None
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            self.fail(f"{where}.{key}", f"is {v!r}, not a positive whole number")
        return v

    def rows(self, r: dict, key: str, least: int = 0) -> list:
        v = r.get(key)
        if not isinstance(v, list) or len(v) < least or not all(isinstance(x, dict) for x in v):
            self.fail(key, f"is not a list of at least {least} records")
        return v

    def text(self, d: dict, key: str, where: str) -> str:
        v = d.get(key) if isinstance(d, dict) else None
        if not isinstance(v, str) or not 0 < len(v) <= 4096:
            self.fail(f"{where}.{key}", "is not a name")
        return v


def _checked(path: str, r: dict) -> dict:
    c = _Check(path)
    for key in ("source", "base_file", "default_type"):
        c.text(r, key, "recipe")
    target = r.get("target")
    if not isinstance(target, dict) or target.get("kind") not in ("size", "kld"):
        c.fail("target", "is not a size or KLD target")
    c.number(target, "value", "target")
    c.count(r, "size", "recipe")
    for key in ("measured_kld", "predicted_kld"):
        c.number(r, key, "recipe")
    for i, row in enumerate(c.rows(r, "rounds", 1)):
        c.count(row, "size", f"rounds[{i}]")
        for key in ("predicted", "measured", "uncorrected"):
            c.number(row, key, f"rounds[{i}]")
    frontier = c.rows(r, "frontier", 1)
    last = 0
    for i, q in enumerate(frontier):
        size = c.count(q, "bytes", f"frontier[{i}]")
        if size <= last:
            c.fail(f"frontier[{i}].bytes", f"is {size:,}, not above the point before's {last:,}")
        last = size
        for key in ("predicted", "predicted_additive", "lower_bound"):
            c.number(q, key, f"frontier[{i}]")
    for i, m in enumerate(c.rows(r, "mixes_on_cost_windows")):
        c.text(m, "name", f"mixes_on_cost_windows[{i}]")
        c.count(m, "bytes", f"mixes_on_cost_windows[{i}]")
        c.number(m, "kld", f"mixes_on_cost_windows[{i}]")
    if r.get("proof") is not None:
        _check_proof(c, r["proof"])
    if r.get("routing_flips") is not None:
        for key in ("decisions", "tokens_any_layer"):
            if c.number(r["routing_flips"], key, "routing_flips") > 1:
                c.fail(f"routing_flips.{key}", "is above 1")
    windows = r.get("cost_windows")
    if not isinstance(windows, list) or not windows or not all(isinstance(w, int) and w >= 0 for w in windows):
        c.fail("cost_windows", "is not a list of window numbers")
    return r


def _check_proof(c: _Check, proof) -> None:
    if not isinstance(proof, dict):
        c.fail("proof", "is not a record")
    c.count(proof.get("recipe"), "bytes", "proof.recipe")
    c.number(proof.get("recipe"), "kld", "proof.recipe")
    for i, m in enumerate(c.rows(proof, "mixes", 1)):
        where = f"proof.mixes[{i}]"
        c.text(m, "mix", where)
        c.count(m, "bytes", where)
        c.number(m, "kld", where)
        c.number(m, "recipe_minus_mix", where, low=-math.inf)
        span = m.get("interval_95")
        ok = isinstance(span, list) and len(span) == 2
        ok = ok and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in span)
        if not ok or span[0] > span[1]:
            c.fail(f"{where}.interval_95", "is not a finite interval [low, high]")
        says = verdict(*span)
        if m.get("recipe_is") != says:
            c.fail(f"{where}.recipe_is", f"is {m.get('recipe_is')!r}, but its interval says {says!r}")


def read_recipes(paths: list[str]) -> list[dict]:
    """Each recipe with its ``label`` (its output directory) and ``path``; recipes of another
    source, base file or cost windows than the first are refused in one line."""
    import os

    out = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                r = json.loads(f.read(MAX_BYTES))
        except (OSError, ValueError) as e:
            raise UsageError(f"{path}: cannot read a recipe ({e})") from None
        if not isinstance(r, dict) or r.get("kldtool") != KIND:
            raise UsageError(f"{path}: not a kldtool recipe result (OUT/recipe.json)")
        if "frontier" not in r:
            raise UsageError(f"{path}: written by a kldtool before recipes held their frontier: run recipe again")
        r = _checked(path, r)
        if out:
            for key in ("source", "base_file", "cost_windows"):
                if r[key] != out[0][key]:
                    raise UsageError(f"{path}: its {key} differs from {out[0]['path']}'s: not one frontier")
        r["label"] = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
        r["path"] = path
        out.append(r)
    return out
