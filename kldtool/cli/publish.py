"""Commands that publish a base file: ``pack`` (a reference pack others compare against without
the base model) and ``verify`` (a pack's every byte against its manifest)."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Optional

import typer

from kldtool.cli.app import app
from kldtool.errors import UsageError


@app.command()
def pack(
    base_file: str = typer.Argument(..., help="The base file to publish."),
    out_dir: Optional[str] = typer.Option(None, "-o", "--output", help="The pack's directory (must not exist)."),
    keep: str = typer.Option(
        "top-64", "--keep", help="top-K: a full-row base file is packed as top-K records; all: as it is."
    ),
):
    """A reference pack: the base file (top-K records unless --keep all), a manifest of what it
    was measured from and every file's sha256, and a README with the commands that use it."""
    from kldtool.codec.topk_records import keep_of
    from kldtool.logitsfile import open_base_file
    from kldtool.logitsfile.pack import file_name, write_pack

    if out_dir is None:
        raise UsageError("pack needs -o DIR (a new directory)")
    top = keep_of(keep)
    reader = open_base_file(base_file)
    try:
        top = top if not reader.header.keep else None  # a top-K file is packed as it is
        stem = file_name(reader.path, "base" + (".kldt" if reader.format_name == "kldtool" else ".kld"))

        def put_base(tmp: str) -> str:
            if top:
                from kldtool.logitsfile.to_topk import write_topk

                name = f"{stem.rsplit('.', 1)[0]}.top{top}.kldt"
                write_topk(reader, os.path.join(tmp, name), top, dict(reader.metadata))
            else:
                name = stem
                shutil.copyfile(reader.path, os.path.join(tmp, name))
            return name

        done = write_pack(out_dir, put_base, _receipts)
    finally:
        reader.close()
    size = sum(os.path.getsize(os.path.join(done, f)) for f in os.listdir(done))
    print(f"pack: {done}: {size / 2**20:.2f} MiB" + (f" (top-{top} of {base_file})" if top else ""), file=sys.stderr)


def _receipts(path: str) -> dict:
    """What the base file at ``path`` was measured from, for the manifest and the README."""
    from kldtool.logitsfile import open_base_file
    from kldtool.logitsfile.to_topk import outside_mass
    from kldtool.pipeline.compat import file_protocol
    from kldtool.provenance.identity import base_identity

    reader = open_base_file(path)
    try:
        meta = reader.metadata
        return {
            "base": base_identity(reader),
            "format": reader.format_name,
            "protocol": file_protocol(reader),
            "tokenizer": meta.get("tokenizer_identity"),
            "model": meta.get("model"),
            "corpus": meta.get("corpus"),
            **({"outside_mass": outside_mass(reader)} if reader.header.keep else {}),
        }
    finally:
        reader.close()


@app.command()
def verify(
    pack_dir: str = typer.Argument(..., help="A reference pack: its directory, or a hub dataset's name (cached)."),
):
    """Every file of a reference pack against its manifest's sha256, and no file beside them."""
    from kldtool.logitsfile.pack import find_pack, is_pack, verify_pack

    path = find_pack(pack_dir) or pack_dir
    if not is_pack(path):
        raise UsageError(
            f"{pack_dir}: not a reference pack (no {path.rstrip('/')}/manifest.json, nor a cached hub dataset)"
        )
    manifest, fd = verify_pack(path)
    os.close(fd)
    print(f"verify: {path}: {len(manifest['files'])} files match their sha256; base file {manifest['base_file']}")
