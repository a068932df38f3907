"""``kldtool sweep``: many quants against one base file in rounds of windows, each quant leaving
once its place in the ranking is settled.

All quants visit the base file's windows in one seeded random order (``window_order.py``), so
after any round every two of them share their first windows and their difference is paired. A
round takes every quant still in play to the next look of the stopping rule (16, 32, 64, ...
windows: ``stats/sequential.py``, whose intervals allow for the looks). A quant plays on while it
and a neighbour in the ranking by mean KLD cannot yet be told apart, unless its own
``--target-ci`` is met or it has seen every window.

Everything lives in one directory: each quant's compare state (resumed round after round) and
result, and ``sweep.json``, which records each round's players before the round starts, so a
sweep stopped anywhere resumes and makes the same decisions. Who plays a turn, and where, is the
players' business (``sweep_play.LocalPlayers`` here, ``cluster.ray_players`` on a Ray cluster):
the decisions read only the state files, so both print the same. A quant whose turn fails is
out of the sweep, its error in sweep.json and in the table; the others go on.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from kldtool.analysis.state_file import load_state
from kldtool.errors import StateError, UsageError
from kldtool.provenance.identity import base_identity
from kldtool.pipeline.sinks import Sinks
from kldtool.pipeline.sweep_play import Play, Quant
from kldtool.runtime.small_files import read_json, write_json
from kldtool.stats.bootstrap import Bootstrap
from kldtool.stats.sequential import DEFAULT_FIRST, Rule, target_met
from kldtool.text.window_order import Order

KIND = "kldtool-sweep"


def quants_of(models: list[str], directory: str) -> list[Quant]:
    """One quant per ``-m``, labelled by its file or directory name."""
    labels = [os.path.basename(m.rstrip("/")).removesuffix(".gguf") or m for m in models]
    for label in labels:
        if labels.count(label) > 1:
            raise UsageError(f"sweep: two models are named {label}; give each quant its own file or directory name")
    return [Quant(label, m, directory) for label, m in zip(labels, models)]


@dataclass(kw_only=True)
class Sweep:
    reader: object
    quants: list[Quant]
    players: object  # .play(Play, quants, look, sinks) -> [Outcome]: sweep_play.LocalPlayers or cluster/
    order: Order
    span: tuple[int, int]
    first: int = DEFAULT_FIRST
    target: float | None = None
    bootstrap: Bootstrap = Bootstrap()
    force: bool = False
    sinks: Sinks = field(default_factory=Sinks)

    def __post_init__(self):
        a, b = self.span
        self.rule = Rule(b - a, self.first, bootstrap=self.bootstrap)
        self.directory = self.quants[0].directory
        self.log_path = os.path.join(self.directory, "sweep.json")
        self.play = Play(span=self.span, order=self.order, first=self.first, bootstrap=self.bootstrap, force=self.force)

    def run(self) -> dict:
        log = self._open_log()
        t0 = time.time()
        for look in self.rule.looks:
            vectors = self._vectors()
            failed = log.setdefault("failed", {})
            entry = next((r for r in log["rounds"] if r["windows"] == look), None)
            if entry is None:
                players, verdicts = decide(vectors, self.rule, self.target, failed)
                entry = {"windows": look, "players": players, "verdicts": verdicts}
                log["rounds"].append(entry)
                write_json(self.log_path, log)  # before the round: a resumed sweep plays the same quants
            if not entry["players"]:
                break
            # A resumed sweep skips who finished this round before it stopped (result written last).
            todo = [
                q
                for q in self.quants
                if q.label in entry["players"]
                and q.label not in failed
                and not self._done(q, len(vectors[q.label]), look)
            ]
            if todo:
                self.sinks.info(f"sweep: round to {look} of {self.rule.total} windows: {', '.join(entry['players'])}")
                for outcome in self.players.play(self.play, todo, look, self.sinks):
                    self._record(log, look, outcome)
        vectors = self._vectors()
        _, verdicts = decide(vectors, self.rule, self.target, log["failed"])
        summary = self.summary(vectors, verdicts)
        log |= {"finished": True, "wall_time_s": round(time.time() - t0, 3), "quants": summary}
        write_json(self.log_path, log)
        return log

    def _record(self, log: dict, look: int, outcome) -> None:
        """A turn's facts (node, time, attempts) and, for a failed one, its error, in sweep.json."""
        log.setdefault("turns", []).append(outcome.facts(look))
        if outcome.error:
            log["failed"][outcome.label] = outcome.error
        write_json(self.log_path, log)

    def _open_log(self) -> dict:
        os.makedirs(self.directory, exist_ok=True)
        identity = {
            "kind": KIND,
            "base": base_identity(self.reader),
            "chunk_range": list(self.span),
            "order": self.order.describe(),
            "first": self.first,
            "target_ci": self.target,
            "models": {q.label: q.model for q in self.quants},
        }
        if not os.path.exists(self.log_path):
            return identity | {"rule": self.rule.describe(), "rounds": []}
        log = read_json(self.log_path, self.log_path)
        for key, want in identity.items():
            if not isinstance(log, dict) or log.get(key) != want:
                raise StateError(
                    f"{self.log_path}: a sweep with another {key.replace('_', ' ')} "
                    f"({(log or {}).get(key) if isinstance(log, dict) else log!r}); give the same flags or another -o"
                )
        return log

    def _done(self, q: Quant, seen: int, look: int) -> bool:
        """Whether q, holding ``seen`` windows, has this round's and a result of them (written
        after its state)."""
        if seen < min(look, self.rule.total) or not os.path.exists(q.result):
            return False
        written = read_json(q.result, q.result)
        return isinstance(written, dict) and written.get("windows_scored") == seen

    def _vectors(self) -> dict[str, list]:
        """Each quant's chunk vectors in visiting order (none before its first round)."""
        return {q.label: load_state(q.state).acc.chunk_vectors if os.path.exists(q.state) else [] for q in self.quants}

    def summary(self, vectors: dict[str, list], verdicts: dict) -> dict:
        """Per quant: windows, mean KLD and its interval for all the windows, and why it stopped."""
        out = {}
        for label, v in vectors.items():
            failed = verdicts[label].startswith("failed: ")
            facts = self.rule.interval(v) if len(v) >= 2 and not failed else {"windows": len(v)}
            out[label] = facts | {"stopped": verdicts[label]}
        return out


def decide(
    vectors: dict[str, list], rule: Rule, target: float | None, failed: dict[str, str] | None = None
) -> tuple[list[str], dict]:
    """Who plays the next round, and why each quant does or does not, from each quant's chunk
    vectors in visiting order (all in one order, so any two share their first windows). A
    failed quant plays no more and ranks nowhere."""
    failed = failed or {}
    own = {k: rule.interval(v) for k, v in vectors.items() if len(v) >= 2 and k not in failed}
    ranked = sorted(own, key=lambda k: own[k]["kld_mean"])
    pairs = {}
    for lo, hi in zip(ranked, ranked[1:]):
        m = min(len(vectors[lo]), len(vectors[hi]))
        pairs[(lo, hi)] = rule.paired(vectors[lo][:m], vectors[hi][:m])
    players, verdicts = [], {}
    for label, v in vectors.items():
        unsettled = [b if a == label else a for (a, b), p in pairs.items() if label in (a, b) and not p["significant"]]
        if label in failed:
            why = "failed: " + failed[label]
        elif label not in own:
            why = "not started"
        elif len(v) >= rule.total:
            why = "every window scored"
        elif target is not None and target_met(own[label], target):
            why = f"--target-ci {target} met"
        elif unsettled:
            why = "not yet told apart from " + ", ".join(unsettled)
        else:
            why = "told apart from its neighbours"
        if label not in failed and (label not in own or why.startswith("not yet")):
            players.append(label)
        verdicts[label] = why
    return players, verdicts
