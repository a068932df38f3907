"""The noise floor's file: what ``noise-floor --json`` marks in its result, and that result read
back for ``compare --noise-floor`` and ``report --noise-floor``, checked to belong to the base
file it is set against."""

from __future__ import annotations

from kldtool.errors import UsageError
from kldtool.provenance.identity import base_identity
from kldtool.runtime.small_files import read_json

KIND = "noise-floor"  # the command name a floor file records


def mark_floor(result: dict, base: dict | None, this: dict) -> None:
    """Make a compare result of the base model against itself a noise floor's: its mean KLD
    and the two numeric paths (the base file's and this run's)."""
    result["command"] = KIND
    result["noise_floor"] = {"kld_mean": result["statistics"]["kld_mean"], "base_path": base, "this_path": this}


def load_floor(path: str, reader) -> dict:
    """The floor of a ``noise-floor --json`` result, checked to belong to ``reader``'s base file."""
    return read_floor(path, base_identity(reader), reader.path)


def read_floor(path: str, base: dict | None, base_name: str) -> dict:
    """The floor of a ``noise-floor --json`` result, checked to belong to the base file whose
    identity is ``base`` (named ``base_name`` in errors)."""
    floor = read_json(path, f"--noise-floor {path}")
    if not isinstance(floor, dict) or floor.get("command") != KIND or "noise_floor" not in floor:
        raise UsageError(f"--noise-floor {path}: not a `kldtool noise-floor --json` result")
    if floor.get("base") != base:
        raise UsageError(
            f"--noise-floor {path}: measured on another base file than {base_name} (header or tokens differ)"
        )
    return {
        "kld_mean": floor["noise_floor"]["kld_mean"]["value"],
        "source": path,
        "path": floor["noise_floor"]["this_path"],
    }
