"""Issue 67: what recording MoE routing costs a transformers compare, in one run.

For each MoE shape of tests/helpers/vocab_models.py (Qwen 3 MoE; DeepSeek V3 at Kimi K2's
vocabulary), random weights: one base file written with routing (--routing) and one without
(--no-routing), then two transformers engines of the same model, loaded once each, comparing
against them in alternating rounds: (a) the plain compare, (b) the compare that catches each
router's ids and scores and compares them with the stored ones. Prints each one's best time,
the median ratio (b)/(a) over rounds (target: within 1.03), and the routing section's bytes per
token; appends a row per shape to benchmarks/RESULTS.md. Then the same for llama.cpp on the
model's F16 GGUF (tests/helpers/vocab_gguf.py), whose routing comes through its eval callback with
one window per decode. The third shape, eight routed layers over a 512-word vocabulary, is the
worst case: little else to do beside the routers.

    .venv/bin/python benchmarks/moe_routing.py [--ctx 512] [--chunks 8] [--rounds 3] [--shapes qwen3-moe,kimi-k2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from base_fixture import kldtool  # noqa: E402
from results import append_row  # noqa: E402
from timing import alternating, median_ratio  # noqa: E402

# Eight routed layers and a 512-word vocabulary (tests/helpers/moe_models.py): the routers' share
# of the work is far larger than in the shapes above, whose vocabularies dominate.
DEEP = "qwen3-moe-8x256"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default=f"qwen3-moe,kimi-k2,{DEEP}")
    a = ap.parse_args()
    for name in a.shapes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            measure(name, a, Path(tmp))


def shape_files(name: str, tmp: Path) -> tuple[str, list, str]:
    """(model directory, corpus flags, F16 GGUF) of a shape: vocab_models.py's, or DEEP."""
    from helpers import moe_models
    from helpers.vocab_gguf import gguf_of, write_gguf
    from helpers.vocab_models import corpus_flags, model_dir

    if name != DEEP:
        return str(model_dir(name)), corpus_flags(name), str(gguf_of(name))
    model = moe_models.build("qwen3-moe", tmp / "deep", num_hidden_layers=8, hidden_size=256, intermediate_size=512)
    gguf = write_gguf(model, tmp / "deep-F16.gguf", "F16")
    return str(model), ["-f", moe_models.corpus(tmp / "corpus.txt")], str(gguf)


def measure(name: str, a, tmp: Path) -> None:
    from kldtool.engines.llamacpp.engine import LlamaCppEngine
    from kldtool.engines.transformers.engine import TransformersEngine

    model, corpus, gguf = shape_files(name, tmp)
    common = ["-m", model, "--engine", "transformers", *corpus, "-c", a.ctx, "--chunks", a.chunks]
    kldtool("base", *common, "--routing", "--kl-divergence-base", tmp / "routed.kldt")
    kldtool("base", *common, "--no-routing", "--kl-divergence-base", tmp / "plain.kldt")
    files = {"plain": tmp / "plain.kldt", "routing": tmp / "routed.kldt"}
    for label, make in (("transformers fp32", lambda: TransformersEngine(model)), ("llamacpp F16", None)):
        make = make or (lambda: LlamaCppEngine(gguf))
        engines = {"plain": make(), "routing": make()}
        try:
            timed(name, label, engines, files, a)
        finally:
            for e in engines.values():
                e.close()


def timed(name: str, label: str, engines: dict, files: dict, a) -> None:
    from kldtool.logitsfile import open_base_file
    from kldtool.pipeline import run_compare
    from kldtool.pipeline.sinks import Sinks

    quiet = Sinks(out=lambda s: None, info=lambda s: None)
    results = {}

    def run(kind: str):
        def go():
            reader = open_base_file(str(files[kind]))
            try:
                results[kind] = run_compare(engines[kind], reader, sinks=quiet)
            finally:
                reader.close()

        return go

    times = alternating({k: run(k) for k in engines}, a.rounds)
    ratio = median_ratio(times, "routing", "plain")
    routing = results["routing"]["statistics"]["routing"]
    shape = routing["shape"]
    tokens = results["routing"]["scored_tokens"]
    same = results["routing"]["statistics"]["kld_mean"] == results["plain"]["statistics"]["kld_mean"]
    append_row(
        f"MoE routing recorded by a compare, {label} ({name}: {len(shape['layers'])} routed layers, "
        f"{shape['k']} of {shape['n_experts']} experts, random weights; c={a.ctx}, {a.chunks} windows, CPU)",
        f"compare {min(times['plain']):.2f} s plain, {min(times['routing']):.2f} s recording and comparing routing "
        f"({tokens} tokens, {shape['bytes_per_token']} bytes of routing per token stored); same KLD: {same}",
        f"routing / plain {ratio:.3f} (median of {a.rounds} rounds"
        + ("; target ≤ 1.03)" if "transformers" in label else ")"),
    )


if __name__ == "__main__":
    main()
