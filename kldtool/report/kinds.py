"""Results that ``report`` shows only among their own kind (audits of served models, recipes):
given with any other result, the first other is named in one line."""

from __future__ import annotations

from typing import Callable

from kldtool.errors import UsageError


def all_of_kind(paths: list[str], is_kind: Callable[[str], bool], what: str) -> bool:
    """True where every path is of the kind, False where none is; a mixture is refused."""
    found = [p for p in paths if is_kind(p)]
    if not found:
        return False
    if len(found) < len(paths):
        other = next(p for p in paths if p not in found)
        raise UsageError(f"{other}: not {what}; report those apart from the others")
    return True
