"""A reference pack (``kldtool pack``): a base file in a directory of its own, with a manifest of
what it was measured from and of every file's size and sha256, and a README saying what it is
and the commands that use it. Anyone can compare a quant against it without the base model:
``compare --kl-divergence-base DIR`` (or a hub dataset's name, found offline in the local hub
cache) verifies every byte of the pack first (``verify_pack``), then reads the base file it
verified through the descriptor it hashed, not its path again.

A pack comes from elsewhere: its manifest is read with a bound on its size and checked whole
(names, sizes, digests, the files present) before any file is opened, and every file is opened
below the directory's descriptor without following links."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shutil
import stat

from kldtool import __version__
from kldtool.errors import CorruptData, MetadataError, UsageError

MANIFEST = "manifest.json"
README = "README.md"
KIND = "kldtool-reference-pack"
VERSION = 1
MAX_MANIFEST_BYTES = 1 << 20
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_BLOCK = 1 << 20


def _sha256_of(fd: int) -> tuple[int, str]:
    """(bytes, sha256) of an open file, read from its start."""
    h, n = hashlib.sha256(), 0
    os.lseek(fd, 0, os.SEEK_SET)
    while block := os.read(fd, _BLOCK):
        h.update(block)
        n += len(block)
    return n, h.hexdigest()


def _readme(name: str, receipts: dict) -> str:
    from kldtool.stats.run_stats import TAIL_ALLOWANCE

    base = receipts["base"]
    keep, out = base.get("keep"), receipts.get("outside_mass")
    what = (
        f"the top {keep} log-probs of every scored position and the mass of the rest"
        if keep
        else "every scored position's full-vocabulary log-probs"
    )
    gives = (
        f"The kept entries leave {100 * out['mean']:.1f} % of the probability mass out on average "
        f"({100 * out['p99']:.1f} % at the 99th percentile). `compare` against this pack gives PPL, Δp and "
        f"same top p exactly, and the mean KLD as a lower bound (guaranteed: the rest counts as one "
        f"entry) with a tail-corrected estimate and an interval [lower bound, lower bound + "
        f"{TAIL_ALLOWANCE} x the tail estimate] that is empirical: it held for every quant measured "
        f"(kldtool's docs/metrics.md), but it is not a theorem.\n\n"
        if keep
        else "`compare` against this pack gives every statistic as against the base model's own run.\n\n"
    )
    model = (receipts.get("model") or {}).get("model") or "not recorded in the base file"
    return (
        f"# kldtool reference pack\n\n"
        f"`{name}` holds {what}, over the tokens whose sha256 is `{base['tokens_sha256']}` "
        f"({base['n_chunk']} windows of {base['n_ctx']} tokens). Base model: {model}.\n\n{gives}"
        f"`{MANIFEST}` lists every file's size and sha256 and what the base file was measured from.\n\n"
        f"```\nkldtool verify DIR\nkldtool compare -m QUANT --kl-divergence-base DIR --json q.json\n```\n"
    )


def write_pack(out_dir: str, put_base, receipts_of) -> str:
    """A pack in the new directory ``out_dir``: ``put_base(tmp)`` writes the base file into the
    directory being built and returns its name, ``receipts_of(path)`` says what it was measured
    from. Built beside ``out_dir`` under another name and renamed into place whole, so no
    half-written pack looks complete."""
    out_dir = os.path.abspath(out_dir)
    if os.path.lexists(out_dir):
        raise UsageError(f"pack -o {out_dir}: exists; give a new directory")
    tmp = f"{out_dir}.partial-{os.getpid()}"
    try:
        os.mkdir(tmp)
        name = put_base(tmp)
        receipts = receipts_of(os.path.join(tmp, name))
        fd = os.open(os.path.join(tmp, name), os.O_RDONLY | os.O_NOFOLLOW)
        try:
            size, digest = _sha256_of(fd)
        finally:
            os.close(fd)
        readme = _readme(name, receipts).encode("utf-8")
        with open(os.path.join(tmp, README), "xb") as f:
            f.write(readme)
        files = {
            name: {"bytes": size, "sha256": digest},
            README: {"bytes": len(readme), "sha256": hashlib.sha256(readme).hexdigest()},
        }
        manifest = {
            "kind": KIND,
            "version": VERSION,
            "kldtool_version": __version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "base_file": name,
            "files": files,
            "receipts": receipts,
        }
        with open(os.path.join(tmp, MANIFEST), "x", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
        os.rename(tmp, out_dir)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UsageError(f"pack -o {out_dir}: cannot write it ({e.strerror})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def file_name(path: str, fallback: str) -> str:
    """``path``'s base name where it is one a manifest accepts, else ``fallback``."""
    name = os.path.basename(path.rstrip("/"))
    return name if _NAME.fullmatch(name) else fallback


def is_pack(path: str) -> bool:
    return os.path.isdir(path) and os.path.lexists(os.path.join(path, MANIFEST))


def _open_below(dfd: int, name: str, where: str) -> int:
    """``name`` below the directory ``dfd``, a regular file, no link followed."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
    except OSError as e:
        raise CorruptData(f"{where}/{name}: cannot open it in the pack ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorruptData(f"{where}/{name}: not a regular file")
    return fd


def _manifest(dfd: int, where: str) -> dict:
    """The pack's manifest, read within its size bound and checked whole."""
    fd = _open_below(dfd, MANIFEST, where)
    try:
        raw = os.read(fd, MAX_MANIFEST_BYTES + 1)
    finally:
        os.close(fd)
    bad = f"{where}/{MANIFEST}: not a kldtool pack manifest"
    if len(raw) > MAX_MANIFEST_BYTES:
        raise MetadataError(f"{bad} (over {MAX_MANIFEST_BYTES} bytes)")
    try:
        m = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MetadataError(f"{bad} ({type(e).__name__})") from None
    if not isinstance(m, dict) or m.get("kind") != KIND or m.get("version") != VERSION:
        raise MetadataError(f"{bad} (kind {KIND!r}, version {VERSION} expected)")
    files = m.get("files")
    if not isinstance(files, dict) or m.get("base_file") not in (files or {}):
        raise MetadataError(f"{bad} (no file list naming its base file)")
    for name, entry in files.items():
        ok_name = isinstance(name, str) and _NAME.fullmatch(name) and name != MANIFEST
        ok_entry = (
            isinstance(entry, dict)
            and isinstance(entry.get("bytes"), int)
            and entry["bytes"] >= 0
            and isinstance(entry.get("sha256"), str)
            and _SHA256.fullmatch(entry["sha256"])
        )
        if not (ok_name and ok_entry):
            raise MetadataError(f"{bad} (file entry {str(name)[:80]!r})")
    return m


def verify_pack(path: str) -> tuple[dict, int]:
    """Every file of the pack at ``path`` against its manifest, byte for byte, and no file
    beside them: (the manifest, an open descriptor of the base file that was hashed)."""
    where = path.rstrip("/") or "/"
    try:
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise UsageError(f"{where}: cannot open the pack ({e.strerror})") from None
    try:
        m = _manifest(dfd, where)
        present = set(os.listdir(dfd)) - {MANIFEST}
        extra, missing = sorted(present - set(m["files"])), sorted(set(m["files"]) - present)
        if extra or missing:
            what = f"{extra[0]} is not in its manifest" if extra else f"{missing[0]} is missing"
            raise CorruptData(f"{where}: {what}")
        base_fd = None
        try:
            for name, entry in sorted(m["files"].items()):
                fd = _open_below(dfd, name, where)
                size, digest = _sha256_of(fd)
                if (size, digest) != (entry["bytes"], entry["sha256"]):
                    os.close(fd)
                    raise CorruptData(
                        f"{where}/{name}: its bytes differ from the manifest's sha256 (the pack was altered)"
                    )
                if name == m["base_file"]:
                    base_fd = fd
                else:
                    os.close(fd)
        except BaseException:
            if base_fd is not None:
                os.close(base_fd)
            raise
        return m, base_fd
    finally:
        os.close(dfd)


def find_pack(name: str) -> str | None:
    """A pack by hub dataset name (``org/name``, or ``org/name@revision`` for a branch, tag or
    commit), in the local hub cache's dataset layout, offline; None where ``name`` is not such
    a name or the cache holds no such dataset."""
    repo, _, revision = name.partition("@")
    if os.path.exists(name) or repo.count("/") != 1 or not all(_NAME.fullmatch(p) for p in repo.split("/")):
        return None
    if "@" in name and not _NAME.fullmatch(revision):
        return None
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo, repo_type="dataset", revision=revision or None, local_files_only=True)
    except Exception:  # not cached, or no hub library: the caller says the file is not there
        return None
