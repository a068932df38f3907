"""The command line a result records, so that a row of a published table can be run again:
``kldtool`` and the arguments as given. A key never travels as a flag (kldtool reads keys and
tokens from the environment), but a URL may carry a user and password and an argument may
repeat a secret of the environment: both are taken out before anything is recorded."""

from __future__ import annotations

import os
import re
import sys

_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
SECRETS = ("KLDTOOL_ENDPOINT_KEY", "OPENAI_API_KEY", "KLDTOOL_VLLM_TOKEN")


def without_secrets(text: str) -> str:
    """``text`` with every key or token of the environment (``SECRETS``) replaced by ``***``."""
    for name in SECRETS:
        secret = os.environ.get(name)
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def command_line(argv: list[str] | None = None) -> list[str]:
    """``["kldtool", *arguments]`` of this process (or ``argv``), secrets replaced by ``***``."""
    args = sys.argv[1:] if argv is None else argv
    return ["kldtool", *(without_secrets(_USERINFO.sub("***@", str(a))) for a in args)]
