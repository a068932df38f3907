"""A run's manifest: how its numbers were computed (engine and versions, dtype, device kind,
tensor-parallel size, vLLM's runner generation and eager mode, the llama.cpp build's
instruction set and backend, the tokenizer). Base files, compare results, per-token and state files record
it; ``report``, ``diff`` and ``merge`` refuse runs whose manifests disagree on what changes the
numbers, naming the field, unless told ``--mix``.

Runs of different engines are compared on purpose (a GGUF quant through llama.cpp against a
vLLM quant), so only runs of one engine must agree on the numeric fields; shards of one run
(``merge``) must agree on everything.
"""

from __future__ import annotations

import datetime
import platform
from typing import Collection

from kldtool import __version__
from kldtool.errors import UsageError

# Fields that change a run's numbers, compared between runs of one engine.
NUMERIC = ("dtype", "device_kind", "tensor_parallel", "runner", "eager", "cpu_isa", "backend")
# What shards of one run share besides (merge).
ONE_RUN = ("engine", "versions", *NUMERIC)


def run_manifest(engine) -> dict:
    """The manifest of a run from its engine's facts (engines/contract.py's Facts)."""
    from kldtool.provenance.identity import tokenizer_identity

    f = engine.facts
    return {
        "engine": f.name,
        "versions": dict(f.versions) if f.versions is not None else None,
        "dtype": f.dtype,
        "device_kind": str(f.device or "cpu").split(":")[0],
        "tensor_parallel": f.tensor_parallel,
        "runner": f.runner,
        "eager": f.eager,
        "cpu_isa": f.cpu_isa,
        "backend": f.backend,
        "tokenizer": tokenizer_identity(engine),
        "source": f.source,
    }


def check_manifests(
    items: list[tuple[str, dict | None]],
    fields: tuple[str, ...] = NUMERIC,
    per_engine: bool = True,
    hint: str = "--mix",
    *,
    bounded: Collection[str],
) -> None:
    """Refuse, naming the first field, two manifests that disagree on ``fields`` (between runs
    of one engine when ``per_engine``), and a run of an engine in ``bounded`` (whose KLD is a
    lower bound: the registry's engines with that capability) beside one of another. Runs
    without a manifest (older kldtool) are not checked, nor a field one of the two lacks (a
    kldtool older than the field: unknown, not different)."""
    _check_revisions(items, hint)
    _check_kld_kinds(items, hint, bounded)
    seen: dict = {}
    for where, m in items:
        if not m:
            continue
        key = m.get("engine") if per_engine else None
        if key not in seen:
            seen[key] = (where, m)
            continue
        first, ref = seen[key]
        for f in fields:
            if f in m and f in ref and m[f] != ref[f]:
                raise UsageError(
                    f"{where}: manifest field {f} is {m.get(f)!r}, {first}'s is {ref.get(f)!r}: their "
                    f"numbers are not comparable; {hint} allows it"
                )


def backend_change(base: dict | None, facts) -> str | None:
    """What differs between the llama.cpp backend that wrote a base file (its manifest) and the
    one of a run against it, as a sentence; None where they agree or either is not known."""
    if not base or base.get("engine") != facts.name or not base.get("backend") or not facts.backend:
        return None
    if base["backend"] == facts.backend:
        return None
    return (
        f"the base file's logits were computed on llama.cpp's {base['backend']} backend, this run's on "
        f"{facts.backend}: their kernels differ, and so does every statistic by that much"
    )


def _check_kld_kinds(items: list[tuple[str, dict | None]], hint: str, bounded_engines: Collection[str]) -> None:
    """Refuse a run whose KLD is a lower bound beside one whose KLD is the full value: side by
    side they would read as a ranking that one of them cannot give."""
    kinds = [(where, (m or {}).get("engine") in bounded_engines) for where, m in items if m]
    bounded = [w for w, b in kinds if b]
    full = [w for w, b in kinds if not b]
    if bounded and full:
        raise UsageError(
            f"{bounded[0]}: its KLD is a lower bound (compare --endpoint, the server's top-K log-probs), "
            f"{full[0]}'s the full value: their KLDs are not comparable; {hint} allows it"
        )


def _check_revisions(items: list[tuple[str, dict | None]], hint: str) -> None:
    """Refuse two runs of one hub model (and file) read at different snapshots: their names
    say they are the same model, their weights need not be."""
    seen: dict = {}
    for where, m in items:
        source = (m or {}).get("source") or {}
        if not source.get("hub_id"):
            continue
        key = (source["hub_id"], source.get("file"))
        first, ref = seen.setdefault(key, (where, source))
        if source.get("snapshot") != ref.get("snapshot"):
            raise UsageError(
                f"{where}: {source['hub_id']} at revision {source.get('revision')} (snapshot "
                f"{source.get('snapshot')}), {first}'s at {ref.get('revision')} ({ref.get('snapshot')}): "
                f"the same name, other weights; {hint} allows it"
            )


def run_metadata(command: str) -> dict:
    """What every result and base file records of the run that made it."""
    return {
        "kldtool_version": __version__,
        "command": command,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "host": platform.node(),
    }
