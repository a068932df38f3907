"""``base``'s file flags checked together before any model loads: the layout, the rounding, the
kept entries and the clamp window (each error one line naming the flag)."""

from __future__ import annotations

from kldtool.errors import UsageError


def checked_layout(fmt: str, codec: str | None, keep: str | None, clamp: float, frame_rows, protocol: str):
    """(K of --keep top-K or None, the clamp in nats) once the flags fit together."""
    from kldtool.codec import CODECS, check_clamp
    from kldtool.codec.topk_records import keep_of
    from kldtool.logitsfile import FORMATS, check_layout

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if codec is not None and codec not in CODECS:
        raise UsageError(f"--codec {codec!r}: expected one of {', '.join(CODECS)}")
    top = keep_of(keep)
    try:
        clamp = check_clamp(clamp)
    except ValueError as e:
        raise UsageError(f"--clamp: {e}") from None
    check_layout(fmt, protocol, top, clamp, frame_rows)
    return top, clamp
