"""Commands on files, no model run: ``info`` (a base file's header, metadata and sizes),
``convert`` (llama.cpp's raw layout <-> kldtool's container) and ``quantize`` (GGUF quants for
sweeps)."""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

import typer

from kldtool.cli.app import app
from kldtool.cli.flag_groups import ENGINE, FRAME_ROWS
from kldtool.errors import UsageError


TENSOR_TYPE_FILE_MAX = 1 << 20  # characters: a line per tensor of a 1T model is far less


@app.command()
def quantize(
    src: str = typer.Argument(
        ..., help="GGUF to quantize (F16/F32, or a quant: requantized); org/name:file.gguf for one in the hub cache."
    ),
    dst: str = typer.Argument(..., help="GGUF to write (atomically)."),
    type_name: str = typer.Argument(..., metavar="TYPE", help="llama.cpp type: Q8_0, Q6_K, Q4_K_M, Q2_K ..."),
    threads: Optional[int] = ENGINE["threads"][1],
    tensor_type: list[str] = typer.Option(
        [],
        "--tensor-type",
        help="PATTERN=TYPE: tensors whose GGUF name the regular expression finds get TYPE (q6_k, q8_0 ...), "
        "as llama-quantize's --tensor-type; the first line that matches decides. Repeatable.",
    ),
    tensor_type_file: Optional[str] = typer.Option(
        None,
        "--tensor-type-file",
        help="A file of PATTERN=TYPE lines (attribute --tensor-types writes one), after any --tensor-type.",
    ),
    pure: bool = typer.Option(False, "--pure", help="Every tensor at TYPE, none of the mix's own choices (--pure)."),
    json_out: Optional[str] = typer.Option(
        None, "--json", help="Write what was asked and what llama.cpp wrote per line, and the size, here."
    ),
):
    """llama-quantize through llama-cpp-python, for sweeps and per-tensor mixes."""
    from kldtool.provenance import model_ref
    from kldtool.engines.llamacpp import tensor_types as tt
    from kldtool.engines.llamacpp.quantize import quantize
    from kldtool.provenance.sizes import model_size
    from kldtool.runtime.small_files import write_json

    src = model_ref.local_path(src)
    if not os.path.isfile(src):
        raise UsageError(f"{src}: no such GGUF file")
    text = None
    if tensor_type_file is not None:
        try:
            with open(tensor_type_file, encoding="utf-8") as f:
                text = f.read(TENSOR_TYPE_FILE_MAX + 1)
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--tensor-type-file {tensor_type_file}: cannot read it ({e})") from None
        if len(text) > TENSOR_TYPE_FILE_MAX:
            raise UsageError(f"--tensor-type-file {tensor_type_file}: over 1 MiB, not a list of tensor types")
    types = tt.parse_tensor_types(tensor_type, text, tensor_type_file)
    if types:
        import llama_cpp

        for t in types:
            tt.ggml_type_number(llama_cpp, t)  # every type known before the source is read
        decided = tt.check_matches(types, src)
        note = None if pure else tt.counted_note(decided, type_name)
        if note:
            print(note, file=sys.stderr)
    quantize(src, dst, type_name, threads, types, pure)
    size = model_size(dst)
    print(
        f"{src} -> {dst} ({type_name}, {size.file_bytes / 2**20:.1f} MiB, {size.bpw_linear:.3f} bpw)", file=sys.stderr
    )
    rows = tt.written_report(types, dst) if types else []
    for row in rows:
        print(tt.report_line(row), file=sys.stderr)
    if json_out:
        result = {"src": src, "dst": dst, "type": type_name, "pure": pure, "tensor_types": rows}
        write_json(json_out, result | {"file_bytes": size.file_bytes, "bpw_linear": size.bpw_linear})


@app.command()
def info(
    path: str = typer.Argument(..., help="A base file of either format."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
):
    """Show a base file's header, metadata, sizes and completeness."""
    from kldtool.codec import row_width
    from kldtool.logitsfile import frame_facts, open_base_file
    from kldtool.text.protocols import HALF_SCORED_CHUNKS

    reader = open_base_file(path)
    try:
        h = reader.header
        raw_size = 20 + 4 * h.n_tokens + h.scored_tokens * row_width(h.n_vocab) * 2
        data = {
            "path": path,
            "format": reader.format_name,
            "complete": True,
            "protocol": reader.metadata.get("protocol", {}).get("name", HALF_SCORED_CHUNKS),
            "n_ctx": h.n_ctx,
            "n_vocab": h.n_vocab,
            "n_chunk": h.n_chunk,
            "keep": h.keep or "all",
            "clamp_nats": h.clamp,
            "rows_per_chunk": h.rows_per_chunk,
            "scored_tokens": h.scored_tokens,
            **frame_facts(reader),
            "file_bytes": reader.file_size,
            "raw_equivalent_bytes": raw_size,
            "ratio_to_raw": round(reader.file_size / raw_size, 4),
            "store": reader.metadata.get("store", "logprobs"),
            **_hidden_facts(reader.metadata),
            **_routing_facts(reader.metadata),
            **_served_facts(reader.metadata),
            "metadata": reader.metadata,
        }
    finally:
        reader.close()
    if as_json:
        print(json.dumps(data, indent=2))
        return
    for k, v in data.items():
        if k != "metadata":
            print(f"{k:22s}: {v}")
    print("metadata              :")
    print(json.dumps(data["metadata"], indent=2))


def _routing_facts(meta: dict) -> dict:
    """A MoE base file's routing section (routing/section.py): its shape and its size."""
    r = meta.get("routing")
    if not isinstance(r, dict):
        return {}
    return {
        "routing": f"{len(r['layers'])} layers x {r['k']} of {r['n_experts']} experts ({r['scoring']})",
        "routing_bytes_per_token": r["bytes_per_token"],
        "routing_stored_bytes": sum(b for _, b in r["frames"]),
    }


def _served_facts(meta: dict) -> dict:
    """Where a base file written from a server's answers came from (base --endpoint)."""
    model = meta.get("model") or {}
    if model.get("engine") != "endpoint":
        return {}
    return {"source": f"endpoint {model.get('server')}, model {model.get('model')}, form {model.get('endpoint_api')}"}


def _hidden_facts(meta: dict) -> dict:
    """A hidden-state file's two parts, counted apart (the head is stored once), and its replay floor."""
    if meta.get("store") != "hidden":
        return {}
    replay, head = meta.get("replay") or {}, meta["head"]
    external = head.get("external")  # named, not stored: its bytes are the model's
    return {
        "head_bytes": 0 if external else head["length"],
        "head": f"{head['dtype']} {head['shape']}"
        + (f", read from {external} (sha256 {head['sha256'][:16]}...)" if external else ", stored"),
        "hidden": f"{meta['hidden']['dim']} x {meta['hidden']['dtype']}",
        "replay_floor_kld_mean": replay.get("kld_mean"),
        "replay_floor_kld_max": replay.get("kld_max"),
        "replay_max_abs_dlogit": replay.get("max_abs_dlogit"),
    }


@app.command()
def convert(
    src: str = typer.Argument(..., help="Base file to read."),
    dst: str = typer.Argument(..., help="Base file to write."),
    to: Optional[str] = typer.Option(None, "--to", help="kldtool or llamacpp (default: the other format)."),
    keep: Optional[str] = typer.Option(
        None, "--keep", help="top-K: keep each row's K most probable entries and the rest's mass (a container)."
    ),
    frame_rows: Optional[int] = FRAME_ROWS,
):
    """Convert a base file between llama.cpp's raw layout and the kldtool container, or
    re-frame a container (lossless; a frame at a time), or make a full-row file top-K
    (``--keep top-K``). A hidden-state file becomes the full rows it replays."""
    from kldtool.codec.topk_records import keep_of
    from kldtool.logitsfile import FORMATS, open_base_file
    from kldtool.logitsfile.header import CONTAINER, RAW_LAYOUT

    top = keep_of(keep)
    if top and to not in (None, CONTAINER):
        raise UsageError(f"--keep {keep}: top-K records live in the kldtool container, not --to {to}")
    reader = open_base_file(src)
    try:
        target = CONTAINER if top else to or (RAW_LAYOUT if reader.format_name == CONTAINER else CONTAINER)
        if target not in FORMATS:
            raise UsageError(f"--to {target!r}: expected one of {', '.join(FORMATS)}")
        if os.path.abspath(src) == os.path.abspath(dst):
            raise UsageError(f"{dst}: is the input file; choose another output path")
        meta = dict(reader.metadata)
        meta.setdefault("converted_from", {"path": src, "format": reader.format_name})
        for key in ("store", "hidden", "head", "routing"):  # a hidden-state file converts to the rows it replays
            meta.pop(key, None)
        if top:
            from kldtool.logitsfile.to_topk import write_topk

            write_topk(reader, dst, top, meta, frame_rows)
        else:
            _copy_rows(reader, dst, target, meta, frame_rows)
    finally:
        reader.close()
    print(f"{src} ({reader.format_name}) -> {dst} ({target}{f', top-{top}' if top else ''})", file=sys.stderr)


def _copy_rows(reader, dst: str, target: str, meta: dict, frame_rows: int | None) -> None:
    """``reader``'s rows as they are, a frame at a time, to ``dst`` in ``target``'s layout."""
    from kldtool.logitsfile import create_writer, iter_chunks
    from kldtool.routing.section import RoutingReader, RoutingSection

    routing = RoutingReader(reader)
    writer = create_writer(dst, target, reader.header, reader.tokens, meta, frame_rows=frame_rows)
    if routing.shape and target == "kldtool":  # llama.cpp's raw layout has no room for it
        writer.sections = [RoutingSection.copied(routing)]
    frames = reader.frames
    try:
        for k, rows in iter_chunks(reader, range(frames.n_frames), read=reader.read_frame_rows):
            writer.write_rows(rows)
            chunk, row0, n = frames.span(k)
            if row0 + n == reader.header.rows_of(chunk):
                writer.end_chunk()
        writer.finish()
    except BaseException:
        writer.abort()
        raise
