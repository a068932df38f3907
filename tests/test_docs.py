"""The front door and the documents behind it: README stays short enough to read in minutes,
every relative link in README, CONTRIBUTING and docs/ reaches a file, and an anchor that the
file's headings make (as GitHub makes them), and every headline figure names the test or
benchmark behind it (scripts/claims.py); and every repository path a docstring, comment or
document names exists."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.quick

DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings: lower case, punctuation dropped,
    spaces to hyphens, a repeated heading numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, len(lines)
    assert "bash scripts/quickstart.sh" in lines and "bash scripts/test.sh" in lines


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto: are not ours to check here
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading makes #{anchor}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_headline_figure_names_what_backs_it():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "claims.py")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("\n  asserted:") == len(p.stdout.split("\n  tests:")) - 1 >= 18


def test_a_claim_whose_test_asserts_a_looser_literal_fails_the_check(tmp_path, monkeypatch):
    """Issue 78: a test that stops asserting with its claim's table value (here the rolling
    protocol's, loosened to a literal 1e-6) fails ``claims.py --check``, as does a table value
    the headline row does not state."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("claims", ROOT / "scripts" / "claims.py")
    claims = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(claims)
    texts = claims.headline_texts((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8"))
    assert claims.problems(list(texts), texts) == []
    loose = tmp_path / "tests" / "test_rolling_protocol.py"
    loose.parent.mkdir()
    text = (ROOT / "tests" / "test_rolling_protocol.py").read_text(encoding="utf-8")
    loose.write_text(text.replace('claimed("rolling.text")', "1e-6"), encoding="utf-8")
    monkeypatch.setattr(claims, "ROOT", tmp_path)
    row = next(r for r in texts if r.startswith("`ppl --protocol rolling`"))
    found = claims.tolerance_problems(
        "`ppl --protocol rolling` vs lm-evaluation-harness", texts[row], ["tests/test_rolling_protocol.py"]
    )
    assert any("no longer asserts with claimed('rolling.text')" in f for f in found), found
    stated = texts[row].replace("1e-7", "1e-6")
    monkeypatch.setattr(claims, "ROOT", ROOT)
    found = claims.tolerance_problems(
        "`ppl --protocol rolling` vs lm-evaluation-harness", stated, ["tests/test_rolling_protocol.py"]
    )
    assert found == [
        "benchmarks.md: the row '`ppl --protocol rolling` vs lm-evaluation-harness' does not state rolling.text's 1e-7"
    ]


# A path of ours as code and documents cite it: from the repository's root, from kldtool/ (or
# one of its packages), or from the citing file's own directory. vLLM's, llama.cpp's and the
# shared fixtures' paths are theirs.
CITED = re.compile(r"(?<![\w./-])((?:\w[\w-]*/)+[\w-]+\.(?:py|md|sh|toml))\b")
NOT_OURS = ("vllm/", "v1/", "sample/", "fixtures/", "OUT/", "out/", "http")


def test_every_repository_path_a_file_names_exists():
    roots = [ROOT, ROOT / "kldtool", ROOT / "kldtool" / "engines", ROOT / "kldtool" / "engines" / "vllm"]
    missing = []
    for top in ("kldtool", "tests", "scripts", "benchmarks", "docs"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (".py", ".md", ".sh") or not path.is_file():
                continue
            for ref in CITED.findall(path.read_text(encoding="utf-8")):
                if ref.startswith(NOT_OURS):
                    continue
                if not any((base / ref).exists() for base in (*roots, path.parent)):
                    missing.append(f"{path.relative_to(ROOT)}: {ref}")
    assert not missing, missing
