"""GGUFs edited for tests: a copy with the add-BOS flag set."""

from __future__ import annotations

import os
import shutil

from kldtool.errors import EngineError


def copy_with_add_bos(src: str, dst: str, add_bos: bool = True) -> None:
    """Copy a GGUF and set ``tokenizer.ggml.add_bos_token`` in place (the field must exist)."""
    import gguf

    tmp = f"{dst}.partial-{os.getpid()}"
    shutil.copyfile(src, tmp)
    try:
        reader = gguf.GGUFReader(tmp, "r+")
        field = reader.fields.get("tokenizer.ggml.add_bos_token")
        if field is None:
            raise EngineError(f"{src}: has no tokenizer.ggml.add_bos_token field to set")
        field.parts[field.data[0]][0] = 1 if add_bos else 0
        del reader
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
