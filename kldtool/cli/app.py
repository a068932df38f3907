"""The typer app and the process entry point: every known failure becomes a one-line message
with its class's exit code (kldtool.errors), an interrupt exits 130 with partials kept."""

from __future__ import annotations

import signal
import sys

import typer

from kldtool.errors import KldError, UsageError

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
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
    from kldtool.memory import pin_mmap_threshold

    pin_mmap_threshold()
    # A scheduler's SIGTERM gets the same orderly stop as Ctrl-C: checkpoints saved, partials kept.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    cx = _click_exceptions()
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="kldtool")
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except cx.ClickException as e:
        e.show()
        sys.exit(UsageError.exit_code if e.exit_code == 2 else e.exit_code)
    except (KeyboardInterrupt, typer.Abort, getattr(cx, "Abort", typer.Abort)):
        print("kldtool: interrupted; no output file was completed", file=sys.stderr)
        sys.exit(130)
    except KldError as e:
        print(f"kldtool: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)
