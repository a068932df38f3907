"""lm-eval's ``wikitext`` task as a corpus (``--corpus-format wikitext``): a raw WikiText file
cut into articles at its top-level headings (`` = Title = ``), as the
EleutherAI/wikitext_document_level dataset pages it, each page scored after the task's
detokenizer while its words and bytes are counted on the page as written (lm-eval's
``process_results`` counts the original page)."""

from __future__ import annotations

import re


def _is_title(line: str) -> bool:
    flat = line.replace("= = =", "===").replace("= =", "==").strip()
    return flat.startswith("= ") and flat.endswith(" =")


def pages(text: str) -> list[str]:
    """The articles, each from its title line to the line before the next title, lines joined
    by newlines; whitespace-only pages dropped."""
    out, lines = [], []
    for line in text.split("\n"):
        if _is_title(line):
            out.append("\n".join(lines))
            lines = []
        lines.append(line)
    out.append("\n".join(lines))
    return [p for p in out if p.strip()]


def _around(open_: str, close: str) -> tuple[re.Pattern, str]:
    """Spaces just inside a pair of brackets or quotes removed (one pair, lazily matched)."""
    inner = r"\s*([^" + re.escape(close) + r"]*?)\s*"
    return re.compile(re.escape(open_) + inner + re.escape(close)), open_ + r"\1" + close


# In lm-eval's order: each step sees the previous one's output. The second step looks for the
# literal text "/' 0/" and friends (a pattern meant as a character class); kept as it is, since
# the point is to reproduce lm-eval's text byte for byte.
_STEPS: tuple = (
    ("s '", "s'"),
    (re.compile(r"/' [0-9]/"), r"/'[0-9]/"),
    (" @-@ ", "-"),
    (" @,@ ", ","),
    (" @.@ ", "."),
    *((f" {p} ", f"{p} ") for p in ":;.!?,"),
    *(_around(o, c) for o, c in ("()", "[]", "{}", '""', "''")),
    ("= = = =", "===="),
    ("= = =", "==="),
    ("= =", "=="),
    (" \u00b0 ", "\u00b0"),
    (" \n", "\n"),
    ("\n ", "\n"),
    (" N ", " 1 "),
    (" 's", "'s"),
)


def detokenize(page: str) -> str:
    """lm-eval's ``wikitext_detokenizer``: WikiText's spaced punctuation joined back."""
    for old, new in _STEPS:
        page = old.sub(new, page) if isinstance(old, re.Pattern) else page.replace(old, new)
    return page
