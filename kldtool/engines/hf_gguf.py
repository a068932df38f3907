"""transformers' GGUF loader without its repeated work.

Loading one GGUF through transformers (``from_pretrained(..., gguf_file=...)``) parses the
file's metadata once for every config, tokenizer and weights pass, each a Python walk over every
vocabulary string, and builds gguf-py's tensor-name map afresh for every module of the model
(for SmolLM2, 397 maps of the same architecture and depth). Inside ``gguf_loading()`` both are
built once per file and per architecture, the loader unchanged otherwise; the weights and config
it returns are the same objects' contents. The saving grows with the model's depth and
vocabulary: docs/benchmarks.md has the figures. The loader's own tqdm bar is switched off there
too: it redraws with carriage returns on kldtool's stderr, where kldtool's progress goes.
"""

from __future__ import annotations

import contextlib
import functools
import os


def gguf_arch(path: str) -> tuple[str, int]:
    """(general.architecture, block count) of a GGUF; inside ``gguf_loading()`` from the reader
    the loader then reuses, so the file is parsed once."""
    from gguf import GGUFReader

    fields = GGUFReader(path).fields
    arch = bytes(fields["general.architecture"].parts[-1]).decode()
    blocks = fields.get(f"{arch}.block_count")
    return arch, int(blocks.parts[-1][0]) if blocks is not None else 0


@contextlib.contextmanager
def gguf_loading():
    try:
        import gguf
    except ImportError:  # a checkpoint directory needs no gguf; a GGUF gets transformers' own error
        yield
        return

    name_map, reader_class = gguf.get_tensor_name_map, gguf.GGUFReader
    readers: dict[tuple, object] = {}

    def reader(path, mode="r"):
        st = os.stat(path)
        key = (os.path.realpath(path), mode, st.st_size, st.st_mtime_ns)
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    import transformers.modeling_gguf_pytorch_utils as loader

    bar = getattr(loader, "tqdm", None)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    gguf.GGUFReader = reader
    if bar is not None:
        loader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf.get_tensor_name_map, gguf.GGUFReader = name_map, reader_class
        if bar is not None:
            loader.tqdm = bar
