"""Malformed and hostile kldtool specs for a served hook (tests/test_vllm_server.py's fuzz test):
a seeded generator, so a failure names a case that comes back on the next run.

Each case is (label, prompt token ids, the ``vllm_xargs`` value). The specs start from the
requests a real client sends (a compare window of the sandbox's base file, encode, nll, hidden,
probe) and break one or more things at a time: the four attacks the served hook once fell to
(a key that climbs out of the exchange directory, an exchange directory the client picks, a
base file outside the roots, a hidden-state request sized to exhaust memory), wrong types,
negative and huge numbers, NaN and infinities, unicode, separators and dots in keys, absolute
and relative paths, symlinks out of the roots, a FIFO, wrong versions, and missing or wrong
tokens.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
from dataclasses import dataclass
from pathlib import Path

VERSION = 2
# The key format a client of this version sends (the result's file name stem), as the wire
# format's documentation states it: 12 hex digits, "-", a window number or "probe".
KEY = re.compile(r"[0-9a-f]{12}-(?:probe|[0-9]{1,10})\Z")
# What a fixed case's error file must say, by its mutation's label (compare requests only for
# the base file: in another mode the field itself is unknown).
REASONS = {
    "base outside roots": ("outside KLDTOOL_VLLM_BASE_ROOTS",),
    "base not a file": ("is not a regular file",),
    "base not a path": ("expected a path",),
    "base relative": ("expected an absolute path",),
    "base absent": ("No such file or directory",),
    "version": ("wire protocol version",),
    "unknown field": ("unknown field",),
    "mode": ("mode ",),
}


@dataclass
class Sandbox:
    """Directories of one fuzz run: the operator's roots and what lies around them."""

    root: Path
    bases: Path  # KLDTOOL_VLLM_BASE_ROOTS
    exchange: Path  # KLDTOOL_VLLM_EXCHANGE_ROOT
    run: Path  # the hostile client's exchange directory inside it
    outside: Path  # a directory no request may write to
    secret: Path  # a file no request may read
    base: Path  # a real base file inside the roots
    secret_bytes: bytes
    outside_base: Path  # a real base file outside the roots: only the roots' check refuses it

    @classmethod
    def make(cls, root: Path, base_file: Path) -> "Sandbox":
        bases, exchange, outside, secrets = (root / n for n in ("bases", "exchange", "outside", "secrets"))
        for d in (root, bases, exchange, outside, secrets):
            d.mkdir()
        run = exchange / "run"
        run.mkdir()
        secret = secrets / "secret.txt"
        secret_bytes = b"TOPSECRET-" + os.urandom(12).hex().encode()
        secret.write_bytes(secret_bytes + b"\n")
        base = bases / "base.kldt"
        base.write_bytes(base_file.read_bytes())
        (bases / "to-secret.kldt").symlink_to(secret)
        (bases / "to-passwd.kldt").symlink_to("/etc/passwd")
        outside_base = secrets / "outside-base.kldt"
        outside_base.write_bytes(base_file.read_bytes())
        (bases / "to-outside-base.kldt").symlink_to(outside_base)
        (bases / "secrets").symlink_to(secrets, target_is_directory=True)
        (bases / "dir.kldt").mkdir()
        os.mkfifo(bases / "fifo.kldt")
        (exchange / "escape").symlink_to(outside, target_is_directory=True)
        return cls(root, bases, exchange, run, outside, secret, base, secret_bytes, outside_base)

    @property
    def swapped(self) -> Path:
        """A base file path that Swapper replaces while requests name it."""
        return self.bases / "swapped.kldt"


class Swapper:
    """Replaces box.swapped, atomically and over and over until stopped, by a real base file, a
    symlink to the secret, a FIFO and another base file (of other windows): a request that
    names it meets whichever is there when its checks open it, and reads that to its end."""

    def __init__(self, box: Sandbox, other_base: Path):
        self.box, self.other = box, other_base
        self.stop, self.swaps = threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _put(self, kind: int) -> None:
        tmp = self.box.bases / ".swapping"
        if kind == 0:
            tmp.write_bytes(self.box.base.read_bytes())
        elif kind == 1:
            tmp.symlink_to(self.box.secret)
        elif kind == 2:
            os.mkfifo(tmp)
        else:
            tmp.write_bytes(self.other.read_bytes())
        os.replace(tmp, self.box.swapped)
        self.swaps += 1

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            self._put(self.swaps % 4)

    def __enter__(self) -> "Swapper":
        self._put(0)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


class Fuzzer:
    def __init__(
        self,
        box: Sandbox,
        token: str,
        n_vocab: int,
        window: list[int],
        first: int,
        n_scored: int,
        base: Path | None = None,
        seed: int = 20261126,
    ):
        """``window``, ``first`` and ``n_scored``: a window of ``base`` (default box.base), as a
        real compare of it sends them."""
        self.box, self.token, self.n_vocab, self.base = box, token, n_vocab, base or box.base
        self.window, self.first, self.n_scored = window, first, n_scored
        self.rng = random.Random(seed)
        self.count = 0
        self.fixed = self.random = 0  # cases of each kind the last cases() made
        self.expected: dict[str, tuple[str, tuple]] = {}  # key -> (what the run must leave, reasons)

    def key(self) -> str:
        self.count += 1
        return f"{self.rng.getrandbits(48):012x}-{self.count}"

    def templates(self) -> dict[str, dict]:
        """A spec of each mode as a real client of this version sends it."""
        common = {"v": VERSION, "out": str(self.box.run), "token": self.token}
        window = {"first": self.first, "n_scored": self.n_scored, "chunk": 0, "after": 0, "logits_block": 64}
        return {
            "compare": {**common, "mode": "compare", **window, "base": str(self.base)},
            "encode": {
                **common,
                "mode": "encode",
                **window,
                "row_width": 2 * ((self.n_vocab + 1) // 2) + 4,
                "coding": {"codec": "grid", "clamp": 16.0, "keep": None},
            },
            "nll": {**common, "mode": "nll", **window},
            "hidden": {
                **common,
                "mode": "hidden",
                **window,
                "dim": 576,
                "hidden_item": "<f4",
                "n_vocab": self.n_vocab,
                "probe_rows": 0,
            },
            "probe": {**common, "mode": "probe"},
        }

    def mutations(self) -> list[tuple[str, dict]]:
        """(label, field values that replace the template's; None-valued names are dropped)."""
        b, x = self.box, "\u202e\u0000\ud7ff"
        huge = [-1, -(2**63), 2**63, 10**30, 2**31, 0.5, 1e308, True, False, "7", [1], {"a": 1}, None, x]
        out = []
        # The four attacks the hook once fell to.
        out += [
            ("key climbs out", {"key": k})
            for k in ("../escape-1", "../../escape-2", "run/../../escape-3", "..", ".", "/tmp/escape-4", "escape/x-5")
        ]
        out += [
            ("client picks out", {"out": o})
            for o in (
                str(b.outside),
                "/",
                "/tmp",
                str(b.root),
                str(b.exchange / ".." / "outside"),
                str(b.exchange / "escape"),
                "exchange/run",
                "run",
                "",
                str(b.run) + "\0",
                7,
                None,
                [str(b.run)],
            )
        ]
        outside = {
            "/etc/passwd",
            str(b.secret),
            str(b.outside_base),
            str(b.bases / "to-secret.kldt"),
            str(b.bases / "to-passwd.kldt"),
            str(b.bases / "to-outside-base.kldt"),
            str(b.bases / "secrets" / "secret.txt"),
            str(b.bases / ".." / "secrets" / "secret.txt"),
            "/dev/zero",
            "/dev/urandom",
            "/proc/self/environ",
            "/proc/self/mem",
        }
        out += [("base outside roots", {"base": p}) for p in sorted(outside)]
        out += [
            ("base not a file", {"base": p})
            for p in (str(b.bases / "fifo.kldt"), str(b.bases / "dir.kldt"), str(b.bases))
        ]
        out += [("base not a path", {"base": p}) for p in ("", str(b.base) + "\0", 3, None, ["/etc/passwd"])]
        out += [("base relative", {"base": p}) for p in ("bases/base.kldt", "base.kldt", "file://" + str(b.base))]
        out += [("base absent", {"base": str(b.bases / "absent.kldt")})]
        out += [
            ("hidden sized to exhaust memory", {"mode": "hidden", "dim": d, "n_scored": n, "probe_rows": p})
            for d, n, p in (
                (1000000, 1000000, 0),
                (576, 1000000, 0),
                (1000000, self.n_scored, 0),
                (576, self.n_scored, 10**9),
                (2**40, 2**40, 2**40),
            )
        ]
        # Every number field: wrong types, negative, huge, fractional.
        for field in ("first", "n_scored", "chunk", "after", "logits_block"):
            out += [(f"{field} out of range", {field: v}) for v in huge + [self.n_vocab, 10**6]]
        out += [
            ("first past the prompt", {"first": len(self.window)}),
            ("window past the prompt", {"n_scored": 999}),
            ("logits block of zero", {"logits_block": 0}),
        ]
        # Versions and tokens.
        out += [("version", {"v": v}) for v in (None, 1, 3, "2", 2.0, -1, 2**64, [2], x)]
        out += [
            ("token", {"token": t})
            for t in (
                None,
                "",
                "wrong",
                self.token + "x",
                self.token[:-1],
                123,
                [self.token],
                {"t": self.token},
                x,
                "t" * 5000,
            )
        ]
        # Lone surrogates (JSON's "\ud800" escape, plain ASCII on the wire), which once raised out
        # of the hook's step and dropped the other requests of that step (issue 62).
        out += [
            ("lone surrogate token", {"token": self.token + "\ud800"}),
            ("lone surrogate token", {"token": "\udfff"}),
            ("lone surrogate out", {"out": str(b.run) + "/\ud800"}),
            ("lone surrogate out", {"out": "\ud800"}),
            ("base not a path", {"base": str(b.bases) + "/\udfff.kldt"}),
        ]
        # Modes, unknown fields, encode's coding and hidden's sizes.
        out += [("mode", {"mode": m}) for m in ("", "HIDDEN", "eval", "probe ", 1, None, ["nll"], x)]
        out += [("unknown field", {f: 1}) for f in ("evil", "__class__", "path", "row_width2", "")]
        out += [
            ("coding", {"mode": "encode", "row_width": 24580, "coding": c})
            for c in (
                None,
                {},
                {"codec": "evil", "clamp": 16.0, "keep": None},
                {"codec": "grid", "clamp": -1, "keep": None},
                {"codec": "grid", "clamp": 1e9, "keep": None},
                {"codec": "grid", "clamp": 16.0, "keep": 10**9},
                {"codec": "grid", "clamp": 16.0, "keep": 3},
                {"codec": "grid", "clamp": 16.0},
                {"codec": "grid", "clamp": 16.0, "keep": None, "extra": 1},
                "grid",
            )
        ]
        out += [
            ("row width", {"mode": "encode", "row_width": w, "coding": {"codec": "grid", "clamp": 16.0, "keep": None}})
            for w in (0, 1, 10**9, -4, "24580")
        ]
        out += [
            ("hidden sizes", {"mode": "hidden", "dim": 576, "hidden_item": h, "n_vocab": v, "probe_rows": 0})
            for h, v in (("<f8", self.n_vocab), ("<u2", self.n_vocab), ("<f4", 10**9), ("<f4", 0), (None, None))
        ]
        out += [
            ("key", {"key": k})
            for k in (
                "",
                "abc",
                "0123456789ab",
                "0123456789ab-",
                "0123456789AB-1",
                "0123456789ab-1.npz",
                "0123456789ab-1/x",
                "0123456789ab-1\n",
                "ключ-1",
                "0123456789ab-" + "9" * 40,
                None,
                5,
                ["0123456789ab-1"],
            )
        ]
        return out

    def cases(self, random_cases: int = 300) -> list[tuple[str, list[int], object]]:
        """Every fixed case (each mutation in two modes, raw texts, a base file swapped while
        it is read) and ``random_cases`` seeded combinations of 2 to 4 mutations, some with
        prompts of other lengths; each case's expected outcome is in ``expected``."""
        templates = self.templates()
        cases = []
        for label, changes in self.mutations():
            for mode in self.rng.sample(sorted(templates), 2):
                raw = self._spec(templates[mode], changes)
                cases.append((f"{mode}: {label} {changes!r}"[:200], self.window, raw))
                valid = label == "version" and changes.get("v") == VERSION  # 2.0 is 2 in JSON's numbers
                if (mode == "compare" or not label.startswith("base ")) and not valid:
                    self._expect(raw, REASONS.get(label, ()))
        cases += [
            ("compare: a base file swapped while it is read", self.window, self._spec(templates["compare"], {"base": str(self.box.swapped)}))
            for _ in range(24)
        ]  # fmt: skip
        # Texts that are not the spec an object would make.
        raws = [
            "not json",
            "[1, 2]",
            "null",
            '"a string"',
            "NaN",
            '{"v": NaN}',
            '{"v": Infinity}',
            "[" * 20000 + "]" * 20000,
            "[" * 4000 + "]" * 4000,
            '{"a":' * 5000 + "1" + "}" * 5000,
            "x" * 100000,
            json.dumps({**templates["nll"], "key": self.key(), "pad": "p" * 9000}),
            "",
            "\u0000",
            "{}",
            json.dumps({**templates["probe"], "key": self.key()}).replace(self.token, "wrong"),
        ]
        cases += [(f"raw text {r[:30]!r}", self.window, r) for r in raws]
        cases += [(f"not a string: {v!r}", self.window, v) for v in (5, 2.5, True, [1, "a"])]
        self.fixed = len(cases)
        # Random combinations of several mutations at once, and prompts of other lengths.
        mutations = self.mutations()
        while len(cases) < self.fixed + random_cases:
            mode = self.rng.choice(sorted(templates))
            changes = {}
            for _, c in self.rng.sample(mutations, self.rng.randint(2, 4)):
                changes.update(c)
            prompt = (
                self.window
                if self.rng.random() < 0.5
                else [self.rng.randrange(self.n_vocab) for _ in range(self.rng.randint(2, 120))]
            )
            cases.append((f"{mode}: mixed {changes!r}"[:200], prompt, self._spec(templates[mode], changes)))
        self.random = len(cases) - self.fixed
        for _, _, raw in cases:
            self._expect(raw)
        self.rng.shuffle(cases)
        return cases

    def _expect(self, raw, reasons: tuple = ()) -> None:
        """What a case must leave, decided from its envelope as the documentation states the
        rules: with the operator's token, a key of the client's format and the sandbox's own
        exchange directory, exactly one result file named by its key (an error, a result or a
        probe's answer); otherwise nothing anywhere."""
        try:
            spec = json.loads(raw) if isinstance(raw, str) and len(raw) <= 8192 else None
        except (ValueError, RecursionError):
            spec = None
        if not isinstance(spec, dict) or not isinstance(spec.get("key"), str) or not KEY.match(spec["key"]):
            return  # no key to find its outcome by: the outside-write checks cover it
        key = spec["key"]
        if key in self.expected and not reasons:
            return
        told = spec.get("token") == self.token and spec.get("out") == str(self.box.run)
        self.expected[key] = ("one file" if told else "nothing", reasons)

    def problems(self, results: Path, log: str | None = None) -> list[str]:
        """Cases whose outcome is not the expected one: ``results``, the sandbox's exchange
        directory after the run; ``log``, the server's log (each untold request's key is there)."""
        files: dict[str, list[str]] = {}
        for p in results.iterdir():
            files.setdefault(p.name.split(".")[0], []).append(p.name)
        out = []
        for key, (want, reasons) in self.expected.items():
            got = sorted(files.get(key, []))
            if want == "nothing":
                if got:
                    out.append(f"{key}: expected nothing, found {got}")
                elif log is not None and key not in log:
                    out.append(f"{key}: refused without a log line naming it")
                continue
            if len(got) != 1:
                out.append(f"{key}: expected one result file, found {got}")
            elif reasons:
                text = (results / got[0]).read_text() if got[0].endswith(".err") else ""
                if not any(r in text for r in reasons):
                    out.append(f"{key}: {got[0]} says {text[:120]!r}, expected one of {reasons}")
        return out

    def _spec(self, template: dict, changes: dict) -> str:
        spec = {**template, "key": self.key(), **changes}
        return json.dumps({k: v for k, v in spec.items() if v is not None or k not in changes})
