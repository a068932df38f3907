"""A GGUF loaded on a thread while a command starts (engines/llamacpp/load.py): the engine built
for that file takes it and computes what a model it loads itself computes; a load nobody takes is
let go; a file llama.cpp cannot load still gets the engine's own one-line error."""

from __future__ import annotations

import hashlib

import pytest

from conftest import WIKI
from kldtool.engines.llamacpp import load as llamacpp_load
from kldtool.engines.llamacpp.engine import LlamaCppEngine
from kldtool.engines.llamacpp.offload import Offload
from kldtool.errors import EngineError
from kldtool.text.protocols import llamacpp_windows

pytestmark = pytest.mark.quick


def _logit_digests(engine: LlamaCppEngine) -> list[str]:
    windows = llamacpp_windows(engine.tokenize(WIKI.read_bytes()[:20000]), 256, 2, engine.bos_id)
    return [hashlib.sha256(lg.tobytes()).hexdigest() for lg in engine.logits(windows)]


@pytest.mark.full_tier
def test_the_engine_takes_the_model_loaded_early(q4_1_gguf):
    plain = LlamaCppEngine(str(q4_1_gguf), threads=2)
    try:
        expected = _logit_digests(plain)
    finally:
        plain.close()
    llamacpp_load.start(str(q4_1_gguf), {})
    early = LlamaCppEngine(str(q4_1_gguf), threads=2)
    try:
        assert str(q4_1_gguf) not in [load.path for load in llamacpp_load._loads.values()]  # taken, not loaded twice
        assert _logit_digests(early) == expected
    finally:
        early.close()


def test_a_load_nobody_takes_is_let_go(q4_1_gguf, tmp_path):
    llamacpp_load.start(str(q4_1_gguf), {})
    llamacpp_load.start(str(tmp_path / "missing.gguf"), {})  # no file: nothing started
    assert len(llamacpp_load._loads) == 1
    llamacpp_load.drop()
    assert llamacpp_load._loads == {}
    assert llamacpp_load.take(str(q4_1_gguf), Offload()) is None


def test_a_file_llama_cpp_cannot_load_keeps_its_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    llamacpp_load.start(str(bad), {})
    with pytest.raises(EngineError, match="llama.cpp could not load it"):
        LlamaCppEngine(str(bad))
    assert llamacpp_load._loads == {}
