"""The measured costs of a recipe run, one JSON line each, kept so that a killed run resumes:
the first line names what the costs were measured against (the source, the base file, the
windows, the dtype); each record carries the sha256 of its own JSON, so a damaged or edited
line is refused (one line naming it) instead of read. A last line without its newline is what
a kill during its write leaves: it is dropped and measured again. Besides the costs it keeps
each candidate's squared weight error against the source, the proxy --prune estimates from."""

from __future__ import annotations

import hashlib
import json
import os

from kldtool.errors import UsageError

VERSION = 1


def _digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


class CostCache:
    def __init__(self, path: str, identity: dict):
        self.path, self.records, self.errors = path, {}, {}
        head = {"kldtool_recipe_costs": VERSION, "identity": identity}
        if os.path.exists(path):
            self._read(head)
        else:
            self._append(head)

    def _read(self, head: dict) -> None:
        with open(path := self.path, "rb") as f:
            raw = f.read()
        lines = raw.split(b"\n")
        if lines[-1]:  # a kill during the last write
            raw = raw[: len(raw) - len(lines[-1])]
            with open(path, "r+b") as f:
                f.truncate(len(raw))
        lines = lines[:-1]
        try:
            first = json.loads(lines[0]) if lines else None
        except ValueError:
            first = None
        if first is None or "kldtool_recipe_costs" not in first:
            raise UsageError(f"{path}: not a kldtool recipe cost cache (delete it to measure again)")
        if first != head:
            raise UsageError(
                f"{path}: costs measured against another source, base file, windows or dtype "
                f"(give another --cost-cache, or delete it to measure again)"
            )
        for n, line in enumerate(lines[1:], 2):
            try:
                item = json.loads(line)
                ok = item["sha256"] == _digest(item["record"])
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                raise UsageError(f"{path}:{n}: a damaged cost record (its checksum does not match); delete the file")
            r = item["record"]
            if "weight_error" in r and "above_base" not in r:
                self.errors[(r["tensor"], r["sha256"])] = r["weight_error"]
            else:
                self.records[(r["tensor"], r["sha256"])] = r

    def _append(self, obj: dict) -> None:
        line = (json.dumps(obj, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write: a kill leaves the whole line or a partial last one
            os.fsync(fd)
        finally:
            os.close(fd)

    def get(self, tensor: str, sha256: str) -> dict | None:
        return self.records.get((tensor, sha256))

    def put(self, record: dict) -> None:
        self._append({"record": record, "sha256": _digest(record)})
        self.records[(record["tensor"], record["sha256"])] = record

    def error(self, tensor: str, sha256: str) -> float | None:
        """The candidate's squared weight error against the source (recipe/pruning.py), if known."""
        return self.errors.get((tensor, sha256))

    def put_error(self, tensor: str, sha256: str, value: float) -> None:
        record = {"tensor": tensor, "sha256": sha256, "weight_error": value}
        self._append({"record": record, "sha256": _digest(record)})
        self.errors[(tensor, sha256)] = value
