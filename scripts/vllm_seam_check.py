"""Does a vLLM release still have everything kldtool's hook uses? Reads its source (an
installed package directory or a wheel, never imported) against ``kldtool.engines.vllm.seam.SEAM``
and prints one line per item; exit status 1 if anything is missing or changed.

    .venv/bin/python scripts/vllm_seam_check.py                       # the installed vllm(-cpu)
    .venv/bin/python scripts/vllm_seam_check.py --download 0.33.0     # pip download --no-deps, then check
    .venv/bin/python scripts/vllm_seam_check.py path/to/vllm-X.whl path/to/site-packages/vllm
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from kldtool.engines.defaults import cache_dir
from kldtool.engines.vllm.seam import SEAM


class Source:
    """Files of one vLLM release, by their path from the package's parent (``vllm/...``)."""

    def __init__(self, where: str):
        self.where = where
        if where.endswith(".whl"):
            self.zip = zipfile.ZipFile(where)
            version = next(
                (
                    n.split("/")[0].removesuffix(".dist-info").split("-")[1]
                    for n in self.zip.namelist()
                    if n.endswith(".dist-info/METADATA")
                ),
                "?",
            )
        else:
            self.zip, self.root = None, Path(where).resolve().parent
            version = ast.literal_eval(_assignment(self.read("vllm/_version.py"), "__version__") or "'?'")
        self.version = version

    def read(self, path: str) -> str | None:
        try:
            if self.zip is not None:
                return self.zip.read(path).decode("utf-8")
            return (self.root / path).read_text(encoding="utf-8")
        except (KeyError, FileNotFoundError):
            return None


def _assignment(text: str | None, name: str) -> str | None:
    for node in ast.walk(ast.parse(text or "")):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.unparse(node.value)
    return None


def _members(cls: ast.ClassDef) -> dict[str, ast.AST]:
    """Methods, annotated fields and ``self.X`` assignments anywhere in the class."""
    out: dict[str, ast.AST] = {}
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in cls.body:
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.setdefault(node.target.id, node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.setdefault(t.attr, node)
    return out


def _module_member(body: list[ast.stmt], name: str) -> ast.AST | None:
    """A module-level function or variable, also one defined under ``if`` or ``try``."""
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            if any(
                isinstance(t, ast.Name) and t.id == name
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            ):
                return node
        if isinstance(node, (ast.If, ast.Try)):
            inner = [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            found = _module_member(inner, name)
            if found is not None:
                return found
    return None


def check(src: Source) -> list[tuple[bool, str]]:
    lines, trees = [], {}
    for path, cls_name, member, params in SEAM:
        what = f"{path}: {cls_name + '.' if cls_name else ''}{member}"
        if path not in trees:
            text = src.read(path)
            trees[path] = ast.parse(text) if text is not None else None
        tree = trees[path]
        if tree is None:
            lines.append((False, f"{what}: file missing"))
            continue
        scope = tree.body
        if cls_name:
            cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
            if cls is None:
                lines.append((False, f"{what}: class {cls_name} missing"))
                continue
            found = _members(cls).get(member)
        else:
            found = _module_member(scope, member)
        if found is None:
            lines.append((False, f"{what}: missing"))
        elif params is not None:
            got = tuple(a.arg for a in found.args.args)[: len(params)]
            lines.append(
                (
                    got == params,
                    f"{what}({', '.join(got)})" + ("" if got == params else f": expected ({', '.join(params)})"),
                )
            )
        else:
            lines.append((True, what))
    return lines


def download(version: str) -> str:
    dest = cache_dir() / "wheels" / "vllm-source"
    found = sorted(dest.glob(f"vllm-{version}-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), f"vllm=={version}"],
            check=True,
        )
        found = sorted(dest.glob(f"vllm-{version}-*.whl"))
    return str(found[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="*", help="vllm package directories or wheels (default: the installed one)")
    ap.add_argument(
        "--download",
        action="append",
        default=[],
        metavar="VERSION",
        help="fetch that release's wheel (pip download --no-deps, cached) and check it",
    )
    a = ap.parse_args()
    sources = a.sources + [download(v) for v in a.download]
    if not sources:
        import importlib.util

        spec = importlib.util.find_spec("vllm")
        if spec is None:
            raise SystemExit("no vllm installed; name a wheel or use --download VERSION")
        sources = [os.path.dirname(spec.origin)]
    bad = 0
    for where in sources:
        src = Source(where)
        results = check(src)
        missing = sum(not ok for ok, _ in results)
        bad += missing
        print(f"vLLM {src.version} ({where}): {len(results) - missing} of {len(results)} seam items present")
        for ok, line in results:
            print(f"  {'ok     ' if ok else 'MISSING'} {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
