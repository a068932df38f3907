"""The ``kldtool`` command line, one module per group of commands: ``runs`` (base, ppl),
``generate`` (a model's own answers), ``compare`` (compare, noise-floor), ``sweep``, ``finished`` (merge, report, diff, worst: commands over
finished runs) ``files`` (info, convert, quantize) and ``publish`` (pack, verify). Each command parses flags (shared ones
in ``flag_groups`` and ``options``) and calls the pipeline; ``app`` maps failures to exit codes."""

# Importing a group registers its commands; --help lists them in this order.
from kldtool.cli import runs  # noqa: F401  isort: skip
from kldtool.cli import generate  # noqa: F401  isort: skip
from kldtool.cli import compare  # noqa: F401  isort: skip
from kldtool.cli import sweep  # noqa: F401  isort: skip
from kldtool.cli import finished  # noqa: F401  isort: skip
from kldtool.cli import files  # noqa: F401  isort: skip
from kldtool.cli import publish  # noqa: F401  isort: skip
from kldtool.cli import attribute  # noqa: F401  isort: skip
from kldtool.cli import recipe  # noqa: F401  isort: skip
from kldtool.cli.app import app, main

__all__ = ["app", "main"]
