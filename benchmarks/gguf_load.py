"""Loading a GGUF through transformers, as the transformers engine and `kldtool attribute` do:
transformers' loader as it is, against the same loader inside
kldtool.engines.hf_gguf.gguf_loading() (metadata parsed once per file, gguf-py's
tensor-name map built once per architecture).

Each round loads the tokenizer and the model both ways, in a fresh process each, alternating
which goes first; the two loads must give equal tensors, configs and vocabularies. Prints the
best and median times and appends a dated row to benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/gguf_load.py [--gguf FILE] [--rounds 3]

The default file is the built-in SmolLM2-135M Q4_1 (30 layers, a 49,152-token vocabulary).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from results import append_row

ONE_LOAD = """
import contextlib, hashlib, json, sys, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from kldtool.engines.hf_gguf import gguf_loading
path, fast = sys.argv[1], sys.argv[2] == "1"
folder, name = path.rsplit("/", 1)
t = time.perf_counter()
with gguf_loading() if fast else contextlib.nullcontext():
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
seconds = time.perf_counter() - t
h = hashlib.sha256()
for key, tensor in sorted(model.state_dict().items()):
    h.update(key.encode())
    h.update(tensor.contiguous().numpy().tobytes())
h.update(json.dumps(model.config.to_dict(), sort_keys=True, default=str).encode())
h.update(json.dumps(sorted(tok.get_vocab().items())).encode())
print(json.dumps({"seconds": seconds, "digest": h.hexdigest()}))
"""


def load(path: str, fast: bool) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", ONE_LOAD, path, "1" if fast else "0"], capture_output=True, text=True, check=True
    )
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", help="a GGUF file (default: the built-in SmolLM2 Q4_1)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    from kldtool.engines.defaults import default_gguf

    path = str(Path(a.gguf or default_gguf()).resolve())
    times = {False: [], True: []}
    digests = set()
    for r in range(a.rounds):
        for fast in (r % 2 == 1, r % 2 == 0):
            got = load(path, fast)
            times[fast].append(got["seconds"])
            digests.add(got["digest"])
            print(f"round {r + 1}: {'gguf_loading' if fast else 'plain       '} {got['seconds']:.2f} s", flush=True)
    if len(digests) != 1:
        sys.exit("the two loaders gave different tensors, configs or vocabularies")
    plain, fast = min(times[False]), min(times[True])
    ratios = [p / f for p, f in zip(times[False], times[True])]
    print(
        f"best: plain {plain:.2f} s, gguf_loading {fast:.2f} s: {plain / fast:.2f}x; median ratio {statistics.median(ratios):.2f}x"
    )
    append_row(
        f"GGUF through transformers ({Path(path).name}, tokenizer and fp32 model, best of {a.rounds})",
        f"plain {plain:.2f} s, gguf_loading {fast:.2f} s; median ratio {statistics.median(ratios):.2f}x; equal tensors, config and vocabulary",
        f"plain / gguf_loading {plain / fast:.2f}x",
    )


if __name__ == "__main__":
    main()
