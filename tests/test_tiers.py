"""The quick tier is the edit loop and touches every test module (issue 86): each tests/test_*.py
has at least one test that `scripts/test.sh --quick` runs (marked ``quick``, by itself or by its
module's ``pytestmark``, and not ``full_tier``). Read from the source, so it costs nothing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

TESTS = Path(__file__).resolve().parent


def _marks(node: ast.AST) -> set[str]:
    """The pytest.mark names a decorator or a pytestmark value applies to the whole test (marks
    inside a parametrize's params apply to those params only)."""
    items = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    found = set()
    for item in items:
        target = item.func if isinstance(item, ast.Call) else item
        if (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Attribute)
            and target.value.attr == "mark"
        ):
            found.add(target.attr)
    return found


def quick_tests(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    module = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            module |= _marks(node.value)
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            marks = module | set().union(*(_marks(d) for d in node.decorator_list))
            own = set().union(*(_marks(d) for d in node.decorator_list))
            if "quick" in marks and "full_tier" not in own:
                out.append(node.name)
    return out


def test_the_rule_reads_marks():
    assert "test_the_rule_reads_marks" in quick_tests(Path(__file__))


def test_every_test_module_has_a_quick_test():
    missing = [p.name for p in sorted(TESTS.glob("test_*.py")) if not quick_tests(p)]
    assert not missing, f"test modules the quick tier never enters: {missing}"
