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


def command_line(argv: list[str] | None = None) -> list[str]:
    """``["kldtool", *arguments]`` of this process (or ``argv``), secrets replaced by ``***``."""
    secrets = [s for s in (os.environ.get(name) for name in SECRETS) if s and len(s) >= 4]

    def clean(arg: str) -> str:
        arg = _USERINFO.sub("***@", arg)
        for s in secrets:
            arg = arg.replace(s, "***")
        return arg

    return ["kldtool", *(clean(str(a)) for a in (sys.argv[1:] if argv is None else argv))]
