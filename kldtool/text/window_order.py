"""The order a compare run visits its windows in: the file's, or a seeded permutation.

A run stopped early in file order has measured the corpus's beginning; in a random order it has
measured a sample of the whole corpus, which is what an early stop (``--target-ci``, ``sweep``)
needs. The permutation depends only on the seed and the number of windows in the run's range,
so every quant of a sweep, every resumed run and every reader of a state file finds the same
order again from the two numbers the results record.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kldtool.errors import UsageError


@dataclass(frozen=True)
class Order:
    seed: int | None = None  # None: the file's order

    @property
    def random(self) -> bool:
        return self.seed is not None

    def arrange(self, items: list) -> list:
        if self.seed is None:
            return list(items)
        return [items[i] for i in np.random.default_rng(self.seed).permutation(len(items))]

    def describe(self) -> dict:
        return {"kind": "random", "seed": self.seed} if self.random else {"kind": "file"}

    def __str__(self) -> str:
        return f"random:{self.seed}" if self.random else "file"


FILE_ORDER = Order()


def order_of(meta: dict | None) -> Order:
    """The order a state file's or result's metadata records (none: the file's, as before orders)."""
    d = (meta or {}).get("order") or {"kind": "file"}
    if d.get("kind") == "random" and isinstance(d.get("seed"), int):
        return Order(d["seed"])
    if d.get("kind") == "file":
        return FILE_ORDER
    raise ValueError(f"unknown window order {d!r}")


def parse_order(spec: str | None) -> Order:
    """``--order file``, ``random`` (seed 0) or ``random:SEED``."""
    if spec is None or spec.strip() == "file":
        return FILE_ORDER
    name, sep, seed = spec.strip().partition(":")
    if name == "random":
        if not sep:
            return Order(0)
        try:
            value = int(seed)
        except ValueError:
            value = -1
        if value >= 0:
            return Order(value)
    raise UsageError(f"--order {spec}: expected file, random or random:SEED (SEED a whole number >= 0)")
