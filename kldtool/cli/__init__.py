"""The ``kldtool`` command line, one module per group of commands: ``runs`` (base, compare,
ppl, noise-floor), ``results`` (report, merge) and ``files`` (info, convert, quantize). Each
command parses flags (shared ones in ``options``) and calls the pipeline; ``app`` maps failures
to exit codes."""

# Importing a group registers its commands; --help lists them in this order.
from kldtool.cli import runs  # noqa: F401  isort: skip
from kldtool.cli import results  # noqa: F401  isort: skip
from kldtool.cli import files  # noqa: F401  isort: skip
from kldtool.cli.app import app, main

__all__ = ["app", "main"]
