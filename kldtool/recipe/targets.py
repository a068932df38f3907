"""A recipe's target as the command line gives it: a file size (``95MB``, ``1.5GiB``, bytes), a
size in bits per weight of the source's parameters, or a mean KLD."""

from __future__ import annotations

import re

from kldtool.errors import UsageError

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
         "gib": 2**30, "tib": 2**40}  # fmt: skip
SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-z]*)\s*$")


def parse_size(text: str) -> int:
    m = SIZE.match(text.lower())
    if not m or m.group(2) not in UNITS:
        raise UsageError(f"--size {text!r}: expected a number of bytes, or one with KB, MB, GB, MiB, GiB ...")
    return int(float(m.group(1)) * UNITS[m.group(2)])


def parameter_count(path: str) -> int:
    """Elements of every tensor of a GGUF (the count bits per weight divide by)."""
    from gguf import GGUFReader

    return sum(int(t.n_elements) for t in GGUFReader(path).tensors)


def target_of(size: str | None, bpw: float | None, target_kld: float | None, src: str) -> tuple[str, float]:
    given = [name for name, v in (("--size", size), ("--bpw", bpw), ("--target-kld", target_kld)) if v is not None]
    if len(given) != 1:
        raise UsageError("recipe: give exactly one of --size, --bpw and --target-kld")
    if size is not None:
        return "size", float(parse_size(size))
    if bpw is not None:
        if not 0 < bpw <= 64:
            raise UsageError(f"--bpw {bpw}: expected bits per weight above 0 and at most 64")
        return "size", float(int(bpw * parameter_count(src) / 8))
    if not target_kld > 0:
        raise UsageError(f"--target-kld {target_kld}: expected a mean KLD above 0")
    return "kld", float(target_kld)
