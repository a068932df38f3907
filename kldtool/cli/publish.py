"""Commands that publish a base file: ``pack`` (a reference pack others compare against without
the base model) and ``verify`` (a pack's every byte against its manifest)."""

from __future__ import annotations

import os
import sys
from typing import Optional

import typer

from kldtool.cli.app import app
from kldtool.errors import UsageError


@app.command()
def pack(
    base_file: str = typer.Argument(..., help="The base file to publish (a top-K one is ~90x smaller)."),
    out_dir: Optional[str] = typer.Option(None, "-o", "--output", help="The pack's directory (must not exist)."),
):
    """A reference pack: the base file, a manifest of what it was measured from and every file's
    sha256, and a README with the commands that use it."""
    from kldtool.logitsfile import open_base_file
    from kldtool.logitsfile.pack import write_pack
    from kldtool.pipeline.compat import file_protocol
    from kldtool.provenance.identity import base_identity

    if out_dir is None:
        raise UsageError("pack needs -o DIR (a new directory)")
    reader = open_base_file(base_file)
    try:
        meta = reader.metadata
        receipts = {
            "base": base_identity(reader),
            "format": reader.format_name,
            "protocol": file_protocol(reader),
            "tokenizer": meta.get("tokenizer_identity"),
            "model": meta.get("model"),
            "corpus": meta.get("corpus"),
        }
        keep = reader.header.keep
    finally:
        reader.close()
    if not keep:
        print(
            f"pack: note: {base_file} stores full rows; a top-K base file (`kldtool base --keep top-64`) "
            f"makes a pack about 90x smaller",
            file=sys.stderr,
        )
    done = write_pack(reader.path, out_dir, receipts)
    print(
        f"pack: {done}: {os.path.basename(reader.path)}, {os.path.getsize(reader.path) / 2**20:.1f} MiB",
        file=sys.stderr,
    )


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
