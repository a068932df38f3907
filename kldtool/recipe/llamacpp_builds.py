"""What llama.cpp builds for a recipe, through llama-quantize's own path: each asked type's
``--pure`` build, and the recipe itself as one tensor-type line a tensor; and what it wrote,
read back per tensor (type, bytes, a digest of the bytes)."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from kldtool.errors import EngineError


@dataclass(frozen=True)
class Written:
    type_name: str  # what llama.cpp wrote, lower case (q5_0 where q4_k was asked on 576-wide rows)
    nbytes: int
    sha256: str  # of the tensor's bytes: the same bytes are the same candidate


def read_written(path: str) -> dict[str, Written]:
    from gguf import GGUFReader

    out = {}
    for t in GGUFReader(path).tensors:
        data = t.data.tobytes() if hasattr(t.data, "tobytes") else bytes(t.data)
        out[t.name] = Written(t.tensor_type.name.lower(), int(t.n_bytes), hashlib.sha256(data).hexdigest())
    return out


def build_pure(src: str, type_name: str, out_dir: str) -> str:
    """The source at ``type_name`` with --pure, kept in ``out_dir`` (built once: the build
    depends only on the source and llama.cpp)."""
    from kldtool.engines.llamacpp.quantize import quantize

    dst = os.path.join(out_dir, f"pure-{type_name}.gguf")
    if not os.path.isfile(dst):
        quantize(src, dst, type_name, pure=True)  # atomic: a killed build leaves no pure-*.gguf
    return dst


def check_type(name: str, where: str) -> None:
    """A type or mix name llama-quantize knows, else one line naming ``where``."""
    from kldtool.engines.llamacpp.quantize import ftype_of

    ftype_of(name, where)


def build_mixes(src: str, names: list[str], builds: str) -> dict[str, str]:
    """Each llama.cpp mix of the source (its own rules, no --pure), built once into ``builds``."""
    from kldtool.engines.llamacpp.quantize import quantize

    out = {}
    for name in names:
        out[name] = os.path.join(builds, f"mix-{name}.gguf")
        if not os.path.isfile(out[name]):
            quantize(src, out[name], name)
    return out


def lines_of(types: dict[str, str], cands) -> list[str]:
    """llama-quantize --tensor-type lines: each tensor's name, and the type llama.cpp writes for
    the chosen candidate (so the lines rebuild the same bytes)."""
    return [f"^{re.escape(t)}$={cands.written[t][asked].type_name}" for t, asked in types.items()]


def build_recipe(src: str, cands, types: dict[str, str], dst: str) -> list[str]:
    """Build the recipe and check every tensor holds the chosen candidate's bytes."""
    from kldtool.engines.llamacpp.quantize import quantize
    from kldtool.engines.llamacpp.tensor_types import parse_tensor_types

    lines = lines_of(types, cands)
    quantize(src, dst, cands.default_type, types=parse_tensor_types(lines, None, None), pure=True)
    got = read_written(dst)
    for t, asked in types.items():
        want = cands.written[t][asked]
        if got[t].sha256 != want.sha256:
            raise EngineError(f"{dst}: {t} is {got[t].type_name}, not the chosen {want.type_name} candidate's bytes")
    return lines
