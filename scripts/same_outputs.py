"""Run one fixed list of kldtool commands and record what they print and write, so that two
checkouts (before and after a restructure) can be held against each other.

    python scripts/same_outputs.py record DIR [--repo CHECKOUT] [--vllm]
    python scripts/same_outputs.py diff DIR_A DIR_B

``record`` runs every command with this interpreter, importing kldtool from CHECKOUT (default:
this one), on the built-in SmolLM2 (its Q4_1 GGUF through llama.cpp, its fp32 copy through
transformers) over a few 128-token chunks of the built-in corpus; ``--vllm`` adds a vLLM
compare (minutes on a CPU). Each command's exit code, stdout and stderr go to
DIR/NN.json, its files stay in DIR/files. ``diff`` prints every difference, after taking out
what changes from run to run (timings, dates, the host, the output directory), and exits 1 if
there is one: text must match line for line, JSON value for value, llama.cpp's raw files and
GGUFs byte for byte, kldtool's containers and per-token files array for array.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

# name, arguments ({G}: the default GGUF, {T}: the transformers copy, {O}: the files directory)
BASE = "-c 128 --chunks 4"
COMMANDS = [
    ("base-container", f"base --engine transformers {BASE} --save-all-logits {{O}}/t.kldt"),
    ("base-raw-transformers", f"base --engine transformers {BASE} --format llamacpp --save-all-logits {{O}}/t.bin"),
    ("base-raw-llamacpp", f"base -m {{G}} {BASE} --format llamacpp --save-all-logits {{O}}/g.bin"),
    ("base-topk", f"base --engine transformers {BASE} --keep 32 --save-all-logits {{O}}/topk.kldt"),
    ("base-hidden", f"base --engine transformers {BASE} --store hidden --save-all-logits {{O}}/hid.kldt"),
    ("info-raw", "info {O}/t.bin"),
    ("info-json", "info --json {O}/t.kldt"),
    ("convert-to-container", "convert {O}/t.bin {O}/t2.kldt"),
    ("convert-to-raw", "convert {O}/t2.kldt {O}/t3.bin"),
    ("quantize", "quantize {G} {O}/q8.gguf Q8_0"),
    ("compare-q4", "compare --kl-divergence-base {O}/t.bin -m {G} --json {O}/c_q4.json --per-token {O}/pt_q4.h5"),
    (
        "compare-q8",
        "compare --kl-divergence-base {O}/t.bin -m {O}/q8.gguf --json {O}/c_q8.json --per-token {O}/pt_q8.h5",
    ),
    ("compare-depth", "compare --kl-divergence-base {O}/t.kldt -m {G} --depth-bins log2 --bootstrap 100"),
    ("compare-topk", "compare --kl-divergence-base {O}/topk.kldt -m {G} --json {O}/c_topk.json"),
    ("compare-hidden", "compare --kl-divergence-base {O}/hid.kldt -m {G} --json {O}/c_hid.json"),
    ("shard-1", "compare --kl-divergence-base {O}/t.bin -m {G} --chunk-range 0:2 --state {O}/s1.json"),
    ("shard-2", "compare --kl-divergence-base {O}/t.bin -m {G} --chunk-range 2:4 --state {O}/s2.json"),
    ("merge", "merge {O}/s1.json {O}/s2.json --json {O}/merged.json"),
    ("report", "report {O}/c_q4.json {O}/c_q8.json --markdown {O}/r.md --csv {O}/r.csv"),
    ("diff", "diff {O}/pt_q4.h5 {O}/pt_q8.h5 --json {O}/diff.json"),
    ("worst", "worst {O}/pt_q4.h5 --json {O}/worst.json"),
    ("noise-floor", "noise-floor --kl-divergence-base {O}/g.bin -m {G} --json {O}/nf.json"),
    ("compare-noise-floor", "compare --kl-divergence-base {O}/g.bin -m {O}/q8.gguf --noise-floor {O}/nf.json"),
    ("ppl-llamacpp", f"ppl -m {{G}} {BASE} --json {{O}}/ppl.json"),
    ("ppl-exl3", f"ppl -m {{G}} --protocol exl3 {BASE}"),
    ("ppl-rolling", "ppl -m {G} --protocol rolling -c 256 --chunks 3 --json {O}/ppl_rolling.json"),
    ("ppl-documents", "ppl -m {G} --protocol documents --lengths 16,64 -f {O}/docs.txt --corpus-format lines"),
    ("ppl-python", f"ppl --engine python -m tests/helpers/tiny_lm.py:make_base {BASE}"),
    ("compare-random-order", "compare --kl-divergence-base {O}/t.kldt --engine transformers --order random:3"),
    ("error-missing-file", "compare --kl-divergence-base {O}/missing.bin -m {G}"),
    ("error-contexts", "compare --kl-divergence-base {O}/t.bin --engine transformers --contexts 2"),
    ("error-vllm-flag", "compare --kl-divergence-base {O}/t.bin -m {G} --tensor-parallel-size 2"),
    ("error-engine", "ppl --engine bogus"),
    ("error-routing", "base --routing --chunks 1 -c 128 --save-all-logits {O}/routing.kldt"),
    ("error-endpoint", "compare --kl-divergence-base {O}/t.bin --endpoint http://127.0.0.1:9 --engine vllm"),
]
VLLM = [("compare-vllm", "compare --kl-divergence-base {O}/t.bin --engine vllm -m {T} --json {O}/c_vllm.json")]
DOCS = "".join(f"A document of {n} words: " + "word " * n + "\n" for n in (10, 40, 80, 120))

# What changes between two runs of the same command on the same machine.
VOLATILE_TEXT = [
    (re.compile(r"\d+(\.\d+)?\s?(s|ms|min|h)\b"), "<t>"),
    (re.compile(r"\d+(\.\d+)?\s?(tokens|tok|windows|chunks)/s\b"), "<rate>"),
    (re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+(\+00:00|Z)?"), "<date>"),
    (re.compile(r"ETA [^ ,)]+"), "ETA <t>"),
    (re.compile(r"[\d.]+ seconds per pass"), "<t> per pass"),
    (re.compile(r'"wall_time_s": [\d.]+'), '"wall_time_s": <t>'),
]
# Log lines and progress bars of vLLM's processes and of torch under them (their pids, times and
# temporary names change from run to run; none is kldtool's).
FOREIGN_LINE = re.compile(r"^\([\w-]+ pid=\d+\) |^\[[WIEF]\d{4} \d|\| \d+/\d+ \[\d\d:\d\d<")
VOLATILE_KEYS = {"created", "host", "wall_time_s", "seconds", "elapsed", "tokens_per_second", "wall", "time"}


def record(out: Path, repo: Path, with_vllm: bool) -> int:
    from_repo = {"PYTHONPATH": str(repo), "KLDTOOL_PROGRESS": "none", "PYTHONUNBUFFERED": "1"}
    env = os.environ | from_repo
    files = out / "files"
    files.mkdir(parents=True, exist_ok=True)
    (files / "docs.txt").write_text(DOCS)
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "from kldtool.engines import defaults as d; print(d.default_gguf()); print(d.default_transformers_model())",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=repo,
    ).stdout.split()
    names = {"G": where[0], "T": where[1], "O": str(files)}
    for n, (name, args) in enumerate(COMMANDS + (VLLM if with_vllm else []), 1):
        argv = args.format(**names).split()
        done = subprocess.run(
            [sys.executable, "-m", "kldtool", *argv], env=env, capture_output=True, text=True, cwd=repo
        )
        print(f"{n:02d} {name}: exit {done.returncode}", file=sys.stderr)
        got = {"name": name, "args": args, "exit": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
        (out / f"{n:02d}.json").write_text(json.dumps(got, indent=1))
    (out / "names.json").write_text(json.dumps(names))
    return 0


def _text(s: str, names: dict) -> list[str]:
    for key in ("O", "G", "T"):
        s = s.replace(names[key], f"<{key}>")
    for pattern, into in VOLATILE_TEXT:
        s = pattern.sub(into, s)
    return [line for line in s.splitlines() if not FOREIGN_LINE.search(line)]


def _json_diff(a, b, where: str, names_a: dict, names_b: dict) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k in VOLATILE_KEYS:
                continue
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'B' if k in b else 'A'}")
            else:
                out += _json_diff(a[k], b[k], f"{where}.{k}", names_a, names_b)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items against {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _json_diff(x, y, f"{where}[{i}]", names_a, names_b)]
    if isinstance(a, str) and isinstance(b, str):
        a, b = "\n".join(_text(a, names_a)), "\n".join(_text(b, names_b))
    return [] if a == b or (a != a and b != b) else [f"{where}: {a!r} against {b!r}"]


def _file_diff(pa: Path, pb: Path, names_a: dict, names_b: dict) -> list[str]:
    if pa.suffix in (".json",):
        if pa.read_bytes()[:2] == b"PK":  # a compare --state file: arrays and their metadata in an npz
            return _state_diff(pa, pb, names_a, names_b)
        return _json_diff(json.loads(pa.read_text()), json.loads(pb.read_text()), pa.name, names_a, names_b)
    if pa.suffix in (".md", ".csv", ".txt"):
        ta, tb = _text(pa.read_text(), names_a), _text(pb.read_text(), names_b)
        return [] if ta == tb else [f"{pa.name}: text differs"]
    if pa.suffix in (".bin", ".gguf"):
        same = hashlib.sha256(pa.read_bytes()).digest() == hashlib.sha256(pb.read_bytes()).digest()
        return [] if same else [f"{pa.name}: bytes differ"]
    if pa.suffix == ".kldt":
        return _container_diff(pa, pb, names_a, names_b)
    if pa.suffix == ".h5":
        return _h5_diff(pa, pb)
    return []


def _container_diff(pa: Path, pb: Path, names_a: dict, names_b: dict) -> list[str]:
    import numpy as np

    from kldtool.logitsfile import open_base_file

    a, b = open_base_file(str(pa)), open_base_file(str(pb))
    try:
        out = _json_diff(a.metadata, b.metadata, f"{pa.name}:metadata", names_a, names_b)
        if not np.array_equal(a.tokens, b.tokens):
            out.append(f"{pa.name}: tokens differ")
        if a.header != b.header:
            out.append(f"{pa.name}: headers differ")
        for i in range(a.header.n_chunk):
            if not np.array_equal(a.read_chunk(i), b.read_chunk(i)):
                out.append(f"{pa.name}: rows of window {i} differ")
        return out
    finally:
        a.close()
        b.close()


def _state_diff(pa: Path, pb: Path, names_a: dict, names_b: dict) -> list[str]:
    import numpy as np

    a, b = np.load(pa), np.load(pb)
    out = _json_diff(*(json.loads(f["meta"].tobytes()) for f in (a, b)), f"{pa.name}:meta", names_a, names_b)
    for key in sorted(set(a.files) | set(b.files) - {"meta"}):
        if key not in a.files or key not in b.files:
            out.append(f"{pa.name}:{key}: in one file only")
        elif key != "meta" and not np.array_equal(a[key], b[key], equal_nan=True):
            out.append(f"{pa.name}:{key}: values differ")
    return out


def _h5_diff(pa: Path, pb: Path) -> list[str]:
    import h5py
    import numpy as np

    out = []
    with h5py.File(pa) as a, h5py.File(pb) as b:
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                out.append(f"{pa.name}:{key}: in one file only")
            elif isinstance(a[key], h5py.Dataset) and not np.array_equal(a[key][()], b[key][()], equal_nan=True):
                out.append(f"{pa.name}:{key}: values differ")
    return out


def diff(da: Path, db: Path) -> int:
    names_a, names_b = (json.loads((d / "names.json").read_text()) for d in (da, db))
    found = []
    for fa in sorted(da.glob("[0-9][0-9].json")):
        fb = db / fa.name
        if not fb.exists():
            found.append(f"{fa.stem}: not run in B")
            continue
        a, b = json.loads(fa.read_text()), json.loads(fb.read_text())
        tag = f"{fa.stem} {a['name']}"
        if a["exit"] != b["exit"]:
            found.append(f"{tag}: exit {a['exit']} against {b['exit']}")
        for stream in ("stdout", "stderr"):
            la, lb = _text(a[stream], names_a), _text(b[stream], names_b)
            if la != lb:
                first = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), min(len(la), len(lb)))
                found.append(
                    f"{tag} {stream} line {first + 1}: {la[first : first + 1]} against {lb[first : first + 1]}"
                )
    for pa in sorted((da / "files").iterdir()):
        pb = db / "files" / pa.name
        found += [f"{pa.name}: missing in B"] if not pb.exists() else _file_diff(pa, pb, names_a, names_b)
    print("\n".join(found) if found else f"same: {len(list(da.glob('[0-9][0-9].json')))} commands and their files")
    return 1 if found else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("record")
    r.add_argument("out", type=Path)
    r.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    r.add_argument("--vllm", action="store_true")
    d = sub.add_parser("diff")
    d.add_argument("a", type=Path)
    d.add_argument("b", type=Path)
    args = p.parse_args()
    if args.verb == "record":
        return record(args.out.resolve(), args.repo.resolve(), args.vllm)
    return diff(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
