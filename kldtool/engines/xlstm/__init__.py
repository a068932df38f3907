"""The xlstm engine (engine.py): helibrunna runs of xLSTM models through the python engine's
interface; the run's layout and history (helibrunna.py)."""

from kldtool.engines.registry import EngineEntry


def _is_run(model: str | None, gguf_file: str | None) -> bool:
    from kldtool.engines.xlstm import helibrunna

    return model is not None and helibrunna.looks_like(model)


ENTRIES = (
    EngineEntry(
        name="xlstm",
        engine="kldtool.engines.xlstm.engine:XlstmEngine",
        recognizes=_is_run,
        text_format="tokens",  # its tokenizer reads whitespace tokens, a document per line
    ),
)
