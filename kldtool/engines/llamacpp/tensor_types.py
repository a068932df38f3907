"""Per-tensor types for `kldtool quantize`, as llama-quantize takes them (``--tensor-type
PATTERN=TYPE``, one such line each in a ``--tensor-type-file``, lower-cased as it lowers them): a
regular expression searched in each tensor's GGUF name, the first line that matches giving its
type. They reach llama.cpp through the quantize parameters' ``tt_overrides``, llama-quantize's
own path. llama.cpp may still write another type where the asked one cannot hold a tensor
(K-quants need rows that are a multiple of 256: it falls back), so what was written is read
back from the output and reported beside what was asked. ggml's type numbers by name are here
too (``ggml_number``), for the KV-cache types as well."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from kldtool.errors import UsageError

# ggml's type numbers (ggml.h) the Python bindings do not export.
UNEXPORTED = {"BF16": 30}
# Tensors llama.cpp's mixes (Q4_K_M ...) count to give every few of them more bits: a line that
# sets one moves which of the later ones get them (docs/usage.md, "Per-tensor types").
COUNTED = ("attn_v.", "ffn_down.")
# A model split by llama.cpp's gguf-split: llama.cpp reads every part from the first one's name.
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


@dataclass(frozen=True)
class TensorType:
    pattern: str
    type_name: str  # lower case, as GGUF readers name it
    where: str  # the flag or FILE:LINE it came from, for errors


def parse_tensor_types(flags: list[str], file_text: str | None, file_name: str | None) -> list[TensorType]:
    """``--tensor-type`` values, then the words of ``--tensor-type-file`` (``#`` lines skipped),
    each checked: PATTERN=TYPE with a pattern Python's ``re`` compiles."""
    items = [(v, f"--tensor-type {v}") for v in flags]
    for n, line in enumerate((file_text or "").splitlines(), 1):
        if not line.strip().startswith("#"):  # llama-quantize reads whitespace-separated lines
            items += [(word, f"{file_name}:{n}") for word in line.split()]
    out = []
    for value, where in items:
        pattern, sep, type_name = value.lower().rpartition("=")
        if not sep or not pattern or not type_name:
            raise UsageError(f"{where}: expected PATTERN=TYPE (e.g. blk\\.0\\.ffn_down\\.weight=q6_k)")
        try:
            re.compile(pattern)
        except re.error as e:
            raise UsageError(f"{where}: {pattern!r} is not a regular expression ({e})") from None
        out.append(TensorType(pattern, type_name.strip(), where))
    return out


def ggml_number(lib, type_name: str) -> int | None:
    """ggml's number for a type name (q8_0, bf16 ...), None where there is no such type."""
    name = type_name.upper()
    number = None if name.endswith("_COUNT") else getattr(lib, f"GGML_TYPE_{name}", UNEXPORTED.get(name))
    return None if number is None else int(number)


def ggml_type_number(lib, t: TensorType) -> int:
    number = ggml_number(lib, t.type_name)
    if number is None:
        raise UsageError(f"{t.where}: unknown ggml type {t.type_name!r} (e.g. q8_0, q6_k, q4_k, q4_0, f16)")
    return number


def overrides_array(lib, types: list[TensorType]):
    """The NULL-terminated ``llama_model_tensor_override`` array llama.cpp reads (keep it alive
    for the call)."""
    array = (lib.llama_model_tensor_override * (len(types) + 1))()
    for i, t in enumerate(types):
        array[i].pattern, array[i].type = t.pattern.encode(), ggml_type_number(lib, t)
    array[len(types)].pattern = None
    return array


def tensor_type_names(path: str) -> dict[str, str]:
    """Each tensor of the GGUF at ``path`` (of every part, for the first of a split model) and
    its type, lower case, in the files' order."""
    from gguf import GGUFReader

    split = SPLIT.search(path)
    parts = [path]
    if split and split.group(1) == "00001":
        n = int(split.group(2))
        parts = [path[: split.start()] + f"-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]
    return {t.name: t.tensor_type.name.lower() for part in parts for t in GGUFReader(part).tensors}


def governed(types: list[TensorType], names) -> dict[int, list[str]]:
    """Per line (its index), the tensors it decides: those it is the first line to match."""
    out: dict[int, list[str]] = {i: [] for i in range(len(types))}
    compiled = [re.compile(t.pattern) for t in types]
    for name in names:
        i = next((i for i, p in enumerate(compiled) if p.search(name)), None)
        if i is not None:
            out[i].append(name)
    return out


def check_matches(types: list[TensorType], src: str) -> dict[int, list[str]]:
    """The tensors of ``src`` each line decides; a line that decides none is refused (a typo,
    almost always)."""
    decided = governed(types, tensor_type_names(src))
    idle = next((types[i] for i, names in decided.items() if not names), None)
    if idle is not None:
        raise UsageError(
            f"{idle.where}: {idle.pattern!r} matches no tensor of {src} that an earlier line leaves "
            f"(GGUF names, e.g. blk.0.attn_q.weight)"
        )
    return decided


def counted_note(decided: dict[int, list[str]], type_name: str) -> str | None:
    """What a mix does around lines that set tensors it counts (None where they set none)."""
    counted = sorted({n for names in decided.values() for n in names if any(c in n for c in COUNTED)})
    if not counted:
        return None
    return (
        f"note: {type_name} gives more bits to every few attn_v and ffn_down tensors, counted in order; "
        f"setting {len(counted)} of them ({counted[0]}{', ...' if len(counted) > 1 else ''}) moves that "
        f"choice in the layers after; --pure keeps every tensor no line sets at one type"
    )


def written_report(types: list[TensorType], dst: str) -> list[dict]:
    """Per line: the pattern, the type asked, and the types llama.cpp wrote for its tensors."""
    written = tensor_type_names(dst)
    decided = governed(types, written)
    return [
        {
            "pattern": t.pattern,
            "asked": t.type_name,
            "tensors": len(decided[i]),
            "written": dict(Counter(written[n] for n in decided[i])),
        }
        for i, t in enumerate(types)
    ]


def report_line(row: dict) -> str:
    got = ", ".join(f"{n} {k}" for k, n in sorted(row["written"].items(), key=lambda kv: -kv[1]))
    fell = [k for k in row["written"] if k != row["asked"]]
    note = f" (not {row['asked']}: llama.cpp's fallback for rows that type cannot hold)" if fell else ""
    return f"  {row['pattern']}={row['asked']}: {row['tensors']} tensor(s) written as {got}{note}"
