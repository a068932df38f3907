"""The typer app and the process entry point: every known failure becomes a one-line message
with its class's exit code (kldtool.errors), an interrupt exits 130 with partials kept."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading

import typer
import typer.core

from kldtool.errors import KldError, UsageError

# `kldtool` alone lists the commands in the order a user meets them, each in one whole line
# (click would cut the docstring's first sentence at the terminal's width).
SUMMARY = {
    "base": "phase 1: the base model over a text -> a base file",
    "compare": "phase 2: a quant over a base file's tokens -> its divergence",
    "report": "one table (and plots) for many compare results",
    "sweep": "rank many quants in rounds, each stopped once settled",
    "diff": "is quant A really better than B? (paired bootstrap)",
    "worst": "the positions and windows where a quant departs most",
    "attribute": "which layers or tensors cause a quant's divergence",
    "recipe": "per-tensor types for a size or KLD target, built and checked",
    "ppl": "a model's perplexity alone, under any protocol",
    "generate": "a model's own answers to prompts -> a corpus for base -f",
    "info": "a base file's header, metadata, sizes and completeness",
    "convert": "a base file between llama.cpp's layout and kldtool's",
    "merge": "compare shards into the statistics of one run",
    "noise-floor": "the base model against itself: the KLD of numerics alone",
    "quantize": "llama-quantize through llama-cpp-python",
    "pack": "a base file as a reference pack others compare against",
    "verify": "a reference pack's every byte against its manifest",
}


class _Commands(typer.core.TyperGroup):
    def list_commands(self, ctx):
        known = super().list_commands(ctx)
        order = list(SUMMARY)
        return sorted(known, key=lambda name: order.index(name) if name in order else len(order))

    def get_command(self, ctx, name):
        command = super().get_command(ctx, name)
        if command is not None and name in SUMMARY:
            command.short_help = SUMMARY[name]
        return command


app = typer.Typer(
    cls=_Commands,
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    # click's own layout: docstrings reflowed into paragraphs, flags without a "<bool>" type
    rich_markup_mode=None,
    help="Measure how far a quantized model's predictions drift from its base model "
    "(llama-perplexity --kl-divergence compatible).",
)


def _click_exceptions():
    # typer 0.2x vendors click as typer._click; earlier releases use click itself.
    try:
        from typer._click import exceptions
    except ImportError:
        from click import exceptions
    return exceptions


def main(argv: list[str] | None = None) -> None:
    _leave(_run(argv))


def _run(argv: list[str] | None) -> int:
    try:
        return _command(argv)
    finally:
        from kldtool.engines.registry import drop_preloads

        drop_preloads()  # a model loaded early that no engine took


def _command(argv: list[str] | None) -> int:
    from kldtool.runtime.memory import POLICIES, set_malloc_policy
    from kldtool.runtime.progress import quiet_third_party

    chosen = os.environ.get("KLDTOOL_MALLOC")
    if chosen and chosen not in POLICIES:  # a typo would silently leave glibc's defaults
        print(f"kldtool: error: KLDTOOL_MALLOC={chosen!r}: expected {', '.join(POLICIES)}", file=sys.stderr)
        return UsageError.exit_code
    set_malloc_policy()
    quiet_third_party()
    # A scheduler's SIGTERM gets the same orderly stop as Ctrl-C: checkpoints saved, partials kept.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    cx = _click_exceptions()
    args = sys.argv[1:] if argv is None else argv
    if "--help" in args:
        from kldtool.cli.engine_flags import show_for

        show_for(args)
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="kldtool")
    except typer.Exit as e:
        return e.exit_code
    except cx.ClickException as e:
        e.show()
        return UsageError.exit_code if e.exit_code == 2 else e.exit_code
    except (KeyboardInterrupt, typer.Abort, getattr(cx, "Abort", typer.Abort)):
        print("kldtool: interrupted; no output file was completed", file=sys.stderr)
        return 130
    except KldError as e:
        print(f"kldtool: error: {_without_secrets(str(e))}", file=sys.stderr)
        return e.exit_code
    return rv if isinstance(rv, int) else 0


def _without_secrets(line: str) -> str:
    """The last guard of the terminal: a key or token from the environment never printed, and no
    control character (an escape sequence a server sent) reaches it."""
    from kldtool.provenance.command_line import without_secrets

    line = without_secrets(line)
    return "".join(c if c.isprintable() or c == "\n" else f"\\x{ord(c):02x}" if ord(c) < 256 else "?" for c in line)


def _leave(code: int) -> None:
    """Exit with ``code`` the way the interpreter does (threads waited for, exit handlers run,
    output flushed), without its teardown of every loaded module: with numba, LLVM, numpy and
    typer loaded that takes as long as a short run's reductions, and a library's own teardown
    (triton's nanobind leak report) would print below our one-line error. Every file a command
    writes is closed by then."""
    shutdown = getattr(threading, "_shutdown", None)  # the interpreter's first exit step
    if not callable(shutdown):  # a Python without it: the normal exit, teardown and all
        sys.exit(code)
    shutdown()  # executors told to stop, every thread other than daemons joined
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away, or a closed stream
            pass
    os._exit(code)
