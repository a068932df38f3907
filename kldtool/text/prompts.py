"""Prompts for ``kldtool generate``: a JSONL file, one prompt a line, either chat messages
(``{"messages": [{"role": ..., "content": ...}, ...]}``, rendered with the model's chat template)
or raw text (``{"prompt": ...}``, tokenized as it is). The built-in set (prompts.jsonl beside this
module) was written for kldtool; its first line says so and is skipped, as is any line whose
``"kldtool"`` key marks it as a header.

A prompts file is the user's, but it is read as any input is: bounded in size, each line checked
whole (a JSON object, one of the two forms, non-empty text, known roles) before anything runs,
and a bad line is a one-line error naming the file and the line."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from kldtool.errors import CorpusError

BUILTIN = "builtin"
BUILTIN_PATH = Path(__file__).with_name("prompts.jsonl")
MAX_BYTES = 64 << 20
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Prompt:
    line: int  # in its file, 1-based
    messages: tuple[dict, ...] | None  # chat messages; None: raw text
    text: str | None  # raw text; None: chat messages

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


@dataclass(frozen=True)
class Prompts:
    name: str  # the file, or "builtin"
    sha256: str  # of the file's bytes
    items: tuple[Prompt, ...]


def read_prompts(path: str | None, first: int | None = None) -> Prompts:
    """The prompts of ``path`` (None or "builtin": kldtool's own set), the first ``first`` of them."""
    name = BUILTIN if path in (None, BUILTIN) else os.fspath(path)
    file = BUILTIN_PATH if name == BUILTIN else Path(name)
    try:
        with open(file, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise CorpusError(f"{name}: cannot read the prompts ({e.strerror})") from None
    if len(data) > MAX_BYTES:
        raise CorpusError(f"{name}: over {MAX_BYTES >> 20} MiB of prompts")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(f"{name}: bytes at offset {e.start} are not UTF-8") from None
    items = []
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            prompt = _prompt(line, f"{name}: line {number}", number)
            if prompt is not None:
                items.append(prompt)
    if first is not None:
        if first < 1:
            raise CorpusError(f"--num-prompts {first}: at least 1")
        items = items[:first]
    if not items:
        raise CorpusError(f"{name}: no prompts")
    return Prompts(name=name, sha256=hashlib.sha256(data).hexdigest(), items=tuple(items))


def _prompt(line: str, where: str, number: int) -> Prompt | None:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise CorpusError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(rec, dict):
        raise CorpusError(f"{where}: not a JSON object")
    if "kldtool" in rec:  # a header
        return None
    if ("messages" in rec) == ("prompt" in rec):
        raise CorpusError(f'{where}: give either "messages" (a chat) or "prompt" (raw text)')
    if "prompt" in rec:
        if not isinstance(rec["prompt"], str) or not rec["prompt"].strip():
            raise CorpusError(f"{where}: an empty prompt")
        return Prompt(line=number, messages=None, text=rec["prompt"])
    messages = rec["messages"]
    if not isinstance(messages, list) or not messages:
        raise CorpusError(f'{where}: "messages" must be a non-empty list')
    for k, m in enumerate(messages):
        ok = isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
        if not ok:
            raise CorpusError(f"{where}: message {k + 1} needs a role ({', '.join(ROLES)}) and a string content")
    if not any(m["content"].strip() for m in messages):
        raise CorpusError(f"{where}: an empty prompt")
    return Prompt(
        line=number, messages=tuple({"role": m["role"], "content": m["content"]} for m in messages), text=None
    )
