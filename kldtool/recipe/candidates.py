"""What a recipe can choose from: for each asked type, llama.cpp's ``--pure`` build of the
source at that type, and for each tensor the type llama.cpp actually wrote there (after its
fallbacks: K-quants need rows that are a multiple of 256) with its exact bytes and a digest of
them. Two asked types that write the same bytes for a tensor are one candidate of it.

The tensors a recipe sets are the source's quantized weights the transformers model has a
parameter for (gguf's own name map); the rest (norms, anything llama.cpp keeps in float) are
the fixed part of the size."""

from __future__ import annotations

import os
from dataclasses import dataclass

from kldtool.errors import UsageError
from kldtool.recipe.llamacpp_builds import Written, build_pure, read_written

FLOAT_TYPES = ("f32", "f16", "bf16", "f64")


@dataclass(kw_only=True)
class Candidates:
    types: list[str]  # as asked, upper case
    builds: dict[str, str]  # asked type -> its --pure build
    tensors: list[str]  # the tensors a recipe sets, in the file's order
    params: dict[str, str]  # tensor -> the transformers parameter holding it
    parts: dict[str, tuple]  # tensor -> its (dimension, start, length) in that parameter, where only a part
    written: dict[str, dict[str, Written]]  # tensor -> asked type -> what was written
    default_type: str  # the build's type for what no line sets: the asked type of the largest build
    fixed_bytes: int  # that build's bytes outside the tensors a recipe sets

    def options(self, tensor: str) -> dict[str, Written]:
        """The distinct candidates of a tensor: the digest's first asked type names it."""
        out: dict[str, Written] = {}
        for t in self.types:
            w = self.written[tensor][t]
            if all(o.sha256 != w.sha256 for o in out.values()):
                out[t] = w
        return out


def parameter_names(model, src: str) -> tuple[dict[str, str], dict[str, tuple]]:
    """GGUF tensor name -> the transformers parameter (gguf's name map for the architecture; a
    mixture's stacked experts by expert_slots, DeepSeek's split kv_b_proj by latent_slots), and
    the tensors that are a part of theirs."""
    import gguf

    from kldtool.engines.hf_gguf import gguf_arch
    from kldtool.engines.latent_gguf import latent_slots
    from kldtool.recipe.expert_slots import expert_slots

    arch, blocks = gguf_arch(src)
    by_name = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in by_name:
        raise UsageError(f"{src}: architecture {arch!r} is not in the gguf package's name map")
    names = gguf.get_tensor_name_map(by_name[arch], blocks)
    out, parts = {}, {}
    for gname, (pname, part) in (expert_slots(model) | latent_slots(model)).items():
        out[gname] = pname
        if part is not None:
            parts[gname] = part
    for pname, p in model.named_parameters(remove_duplicate=False):
        gname = names.get_name(pname, try_suffixes=(".weight", ".bias"))
        if gname is not None and p.dim() >= 2:
            out.setdefault(gname, pname)
    return out, parts


def find_candidates(src: str, model, types: list[str], out_dir: str, say=print) -> Candidates:
    """Build every type, then keep the tensors a recipe sets: quantized in some build and
    held by one of the model's parameters."""
    builds = {}
    for t in types:
        say(f"recipe: llama.cpp's --pure {t} build of {os.path.basename(src)}")
        builds[t] = build_pure(src, t, out_dir)
    written = {t: read_written(p) for t, p in builds.items()}
    params, parts = parameter_names(model, src)
    first = written[types[0]]
    quantized = [n for n in first if any(written[t][n].type_name not in FLOAT_TYPES for t in types)]
    tensors = [n for n in quantized if n in params]
    unmapped = [n for n in quantized if n not in params]
    if unmapped:
        say(f"recipe: {len(unmapped)} quantized tensor(s) with no transformers parameter stay at the largest build's type "
            f"({unmapped[0]}{', ...' if len(unmapped) > 1 else ''})")  # fmt: skip
    if not tensors:
        raise UsageError(f"{src}: no tensor the asked types quantize has a transformers parameter")
    default = max(types, key=lambda t: os.path.getsize(builds[t]))
    fixed = os.path.getsize(builds[default]) - sum(written[default][n].nbytes for n in tensors)
    return Candidates(
        types=list(types),
        builds=builds,
        tensors=tensors,
        params={n: params[n] for n in tensors},
        parts={n: parts[n] for n in tensors if n in parts},
        written={n: {t: written[t][n] for t in types} for n in tensors},
        default_type=default,
        fixed_bytes=fixed,
    )
