"""Small text and JSON outputs, written atomically, and JSON inputs read with a one-line
error naming the file. Used by every layer that writes results."""

from __future__ import annotations

import json

from kldtool.errors import UsageError
from kldtool.logitsfile.atomic import AtomicFile


def write_text(path: str, text: str) -> None:
    f = AtomicFile(path)
    f.write(text.encode("utf-8"))
    f.commit()


def read_json(path: str, where: str) -> object:
    """A JSON file's content; a one-line UsageError naming ``where`` when it cannot be."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise UsageError(f"{where}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise UsageError(f"{where}: not JSON ({e})") from None


def write_json(path: str, payload: dict) -> None:
    write_text(path, json.dumps(payload, indent=2, sort_keys=False, allow_nan=True) + "\n")
