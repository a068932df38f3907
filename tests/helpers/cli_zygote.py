"""A warm interpreter that runs the tests' kldtool commands (conftest.run_cli).

Most of a short command's time on a 2-core machine is importing torch and transformers (about
8 s of an 11 s compare). This process imports them once, then forks a child per command; the
child runs ``python -m kldtool ARGS`` exactly as the interpreter would (runpy, the same
__main__, exit handlers, exit code), with its stdout and stderr in files. Nothing here has run
a torch operation before the fork, so no OpenMP pool or other thread is copied half-alive.

    python tests/helpers/cli_zygote.py     # requests on stdin, one JSON object a line

A request is {"argv": [...], "cwd": DIR, "env": {...}, "out": FILE, "err": FILE}; the reply on
the original stdout is {"rc": exit code}, negative for a signal as subprocess reports it.
"""

import gc
import json
import os
import runpy
import sys


def serve() -> dict | None:
    """Answer requests until stdin closes; a forked child returns its request instead."""
    started = dict(os.environ)  # what the imports below add to it, a fresh process adds too
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints from imports must not reach the reply stream
    import numpy  # noqa: F401
    import torch  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import kldtool.cli.app  # noqa: F401
    import kldtool.engines.transformers.engine  # noqa: F401

    # The imports' 370,000 objects out of the collector's sight: a child's full collections
    # (one in a short compare: 0.64 s over them) then skip them, and do not copy the pages
    # they touch.
    gc.freeze()
    replies.write("ready\n")
    replies.flush()
    for line in sys.stdin:
        job = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            replies.close()
            return job | {"started": started}
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()
    return None


def run(job: dict) -> None:
    """The child: stdio to the request's files, its environment and directory, then the CLI."""
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, job["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    for key in set(job["env"]) | set(job["started"]):
        if job["env"].get(key) != job["started"].get(key):
            if key in job["env"]:
                os.environ[key] = job["env"][key]
            else:
                os.environ.pop(key, None)
    os.chdir(job["cwd"])
    sys.argv = ["kldtool", *job["argv"]]
    runpy.run_module("kldtool", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    request = serve()
    if request is not None:
        run(request)
