"""The python engine (engine.py): a user's factory of a model and its tokenizer, the smallest
engine and the example docs/design.md's "Adding an engine" follows."""

from pathlib import Path

from kldtool.engines.contract import HIDDEN
from kldtool.engines.registry import EngineEntry


def _is_factory(model: str | None, gguf_file: str | None) -> bool:
    return model is not None and ":" in model and not Path(model).exists()  # package.module:factory


ENTRIES = (
    EngineEntry(
        name="python",
        engine="kldtool.engines.python.engine:PythonEngine",
        can=frozenset({HIDDEN}),
        recognizes=_is_factory,
        weights=False,
    ),
)
