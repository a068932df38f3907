"""``kldtool merge``: combine the state files of compare shards (``--chunk-range`` runs on
several machines) into the statistics of one run over all their chunks.

The shards' per-chunk sums are replayed in chunk order, so the result is not merely close to
a single run's: it is the same arithmetic, and every printed line matches. Shards that visited
their windows in a random order (``--order``) are put in window order too: their merge is a
run over all the chunks in the file's order.
"""

from __future__ import annotations

from kldtool.errors import StateError
from kldtool.provenance.identity import model_identity
from kldtool.engines.registry import bounded_engines
from kldtool.provenance.manifest import ONE_RUN, check_manifests
from kldtool.pipeline.sinks import Sinks
from kldtool.provenance.manifest import run_metadata
from kldtool.pipeline.final_report import final_report, replay
from kldtool.analysis.state_file import load_state
from kldtool.report.console import TABLE_HEADER
from kldtool.stats import KldAccumulator
from kldtool.stats.bootstrap import Bootstrap
from kldtool.runtime.small_files import write_json


def run_merge(
    paths: list[str],
    json_path: str | None = None,
    sinks: Sinks | None = None,
    force: bool = False,
    bootstrap: Bootstrap = Bootstrap(),
    mix: bool = False,
) -> dict:
    sinks = sinks or Sinks()
    if not paths:
        raise StateError("merge needs at least one state file (compare --state FILE)")
    shards = sorted(((load_state(p), p) for p in paths), key=lambda sp: sp[0].chunk_range)
    first, first_path = shards[0]
    warnings = []
    for s, p in shards:
        if not s.complete:
            raise StateError(
                f"{p}: shard {':'.join(map(str, s.chunk_range))} is unfinished (holds {s.progress()}); "
                f"finish it with `compare --resume --state {p}`"
            )
        if s.meta["base"] != first.meta["base"]:
            raise StateError(f"{p}: computed on another base file than {first_path} (header/tokens differ)")
        if model_identity(s.meta["model"], False) != model_identity(first.meta["model"], False):
            msg = (
                f"{p}: model {model_identity(s.meta['model'], False)} differs from {first_path}'s "
                f"{model_identity(first.meta['model'], False)}"
            )
            if not force:
                raise StateError(msg + "; --force merges anyway")
            warnings.append("FORCED: " + msg)
        warnings.extend(w for w in s.meta.get("warnings", []) if w not in warnings)
    if not mix:
        check_manifests(
            [(p, s.meta.get("manifest")) for s, p in shards], ONE_RUN, per_engine=False, bounded=bounded_engines()
        )
    for (s, p), (t, q) in zip(shards, shards[1:]):
        if t.chunk_range[0] < s.chunk_range[1]:
            raise StateError(
                f"{q}: chunks {t.chunk_range[0]}:{t.chunk_range[1]} overlap {p}'s {s.chunk_range[0]}:{s.chunk_range[1]}"
            )
        if t.chunk_range[0] > s.chunk_range[1]:
            sinks.info(f"merge: note: chunks {s.chunk_range[1]}:{t.chunk_range[0]} are in no shard")
    whole = KldAccumulator()
    for s, _ in shards:
        whole.merge(s.acc)
    whole = whole.in_window_order()
    sinks.info(f"merge: {len(shards)} shards, {len(whole.chunks)} chunks, {whole.count} tokens")
    sinks.line()
    sinks.line(TABLE_HEADER)
    acc = replay(whole, sinks)
    result = run_metadata("merge") | {
        "protocol": first.meta.get("protocol"),
        "chunks": len(acc.chunks),
        "chunk_ranges": [list(s.chunk_range) for s, _ in shards],
        "scored_tokens": acc.count,
        "base": first.meta["base"],
        "model": first.meta["model"],
        "manifest": first.meta.get("manifest"),
        "shards": [p for _, p in shards],
        "warnings": warnings,
    }
    result["statistics"] = _statistics(first.meta, acc, sinks, warnings, bootstrap)
    result["chunk_sums"] = acc.chunk_table()
    if json_path:
        write_json(json_path, result)
    return result


def _statistics(meta: dict, acc, sinks: Sinks, warnings: list[str], bootstrap: Bootstrap) -> dict:
    """The merged run's final report, as its shards' compare would print it."""
    from kldtool.engines.endpoint.engine import bounded_facts

    keep, shown, origin = meta["base"].get("keep"), bool(meta.get("depth_shown")), meta.get("depth_origin", "window")
    # shards of a run from a server's top K stay bounds: what such a run knows only as one
    bounded = bounded_facts(meta["model"])
    return final_report(acc, sinks, warnings, bootstrap, keep, None, bounded, shown, origin, meta.get("finish"))
