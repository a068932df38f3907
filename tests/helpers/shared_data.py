"""Where the tests' outside references live, and what a clone does without them.

llama.cpp's own base files and printouts, and WikiText-2, come from the project's shared/
directory beside the checkout (or KLDTOOL_SHARED), as CI lays it out. A clone with nothing
beside it still runs every test that needs neither: WIKI falls back to the pydoc topics that
ship with Python (kldtool's own default corpus), the tests that only need *a* llama.cpp-layout
base file get one written by kldtool's llamacpp engine (conftest.fixture_base), and the tests
that compare against llama.cpp's own output or WikiText-2's articles skip, saying where the
files go. Where shared/ is present, a skip fails the run (conftest.pytest_sessionfinish)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
_GIVEN = os.environ.get("KLDTOOL_SHARED")
SHARED = Path(_GIVEN) if _GIVEN else ROOT.parent / "shared"
FIXTURES = SHARED / "fixtures" / "llamacpp"
WIKITEXT = SHARED / "data" / "wikitext-2" / "wiki.test.txt"
HAVE_SHARED = FIXTURES.is_dir() and WIKITEXT.is_file()
NEEDS_SHARED = (
    f"needs llama.cpp's reference files and WikiText-2 from the project's shared/ (none at {SHARED}): "
    "put shared/ beside the checkout or set KLDTOOL_SHARED"
)


def misconfigured() -> str | None:
    """A KLDTOOL_SHARED that names no shared/ is a mistake to report, not a clone to skip for."""
    if _GIVEN and not HAVE_SHARED:
        return f"KLDTOOL_SHARED={_GIVEN}: no fixtures/llamacpp/ and data/wikitext-2/wiki.test.txt there"
    return None


def llamacpp_reference(name: str) -> Path:
    """The path of one of llama.cpp's reference files; the calling test skips without shared/."""
    if not HAVE_SHARED:
        pytest.skip(NEEDS_SHARED)
    return FIXTURES / name


def _fallback_corpus() -> Path:
    """Python's pydoc topics as a text file, written once per machine (whole or not at all)."""
    from kldtool.text.corpus import default_corpus
    from kldtool.engines.defaults import cache_dir

    _, data = default_corpus()
    path = cache_dir() / "test-corpus" / f"pydoc-topics-{len(data)}.txt"
    if not path.exists() or path.stat().st_size != len(data):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path


# The text most tests score: WikiText-2's test split, or a clone's stand-in for it.
WIKI = WIKITEXT if HAVE_SHARED else _fallback_corpus()
