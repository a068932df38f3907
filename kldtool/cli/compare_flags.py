"""compare's own flags that need more than typer's parsing: the chunk range, the checkpoints,
and the protocol flags a base file already decides."""

from __future__ import annotations

from kldtool.errors import UsageError


def check_protocol_flags(
    reader, name: str | None, ctx_size: int | None, stride: int | None, lengths: str | None
) -> None:
    """compare takes the protocol from the base file; flags that say otherwise are refused."""
    from kldtool.pipeline.compat import file_protocol
    from kldtool.text.protocols import parse_lengths

    stored = file_protocol(reader)
    given = {
        "--protocol": (name, stored.get("name")),
        "-c": (ctx_size, stored.get("n_ctx")),
        "--stride": (stride, stored.get("stride")),
    }
    if lengths is not None:
        given["--lengths"] = (tuple(parse_lengths(lengths)), tuple(stored.get("lengths", ())))
    for flag, (want, have) in given.items():
        if want is not None and want != have:
            shown = ",".join(map(str, have)) if isinstance(have, tuple) else have
            raise UsageError(
                f"{flag} {lengths if flag == '--lengths' else want} contradicts {reader.path}, written with "
                f"{'no ' + flag if have in (None, ()) else flag + ' ' + str(shown)}"
                f"{'' if flag == '--protocol' else ' (protocol ' + str(stored.get('name')) + ')'}; "
                f"drop {flag}: compare takes the protocol from the base file"
            )


def parse_chunk_range(spec: str | None, chunks: int | None, n_chunk: int, where: str) -> tuple[int, int]:
    """``--chunk-range A:B`` (0-based, end exclusive: chunks printed A+1..B) and ``--chunks N``."""
    if spec is not None and chunks is not None:
        raise UsageError("--chunks and --chunk-range contradict each other; give one")
    if chunks is not None:
        if chunks < 1:
            raise UsageError(f"--chunks {chunks}: must be at least 1")
        return 0, min(chunks, n_chunk)
    if spec is None:
        return 0, n_chunk
    a_s, sep, b_s = spec.partition(":")
    try:
        a = int(a_s) if a_s.strip() else 0
        b = int(b_s) if b_s.strip() else n_chunk
    except ValueError:
        a = b = -1
    if not sep or not 0 <= a < b or b > n_chunk:
        raise UsageError(f"--chunk-range {spec}: expected A:B with 0 <= A < B <= {n_chunk} (the chunks of {where})")
    return a, b


def checkpoints_of(path: str | None, every: str | None, resume: bool):
    """``--state``, ``--checkpoint-every`` and ``--resume`` as a run's Checkpoints."""
    from kldtool.pipeline.checkpoints import Checkpoints

    if resume and not path:
        raise UsageError("--resume needs --state FILE (the checkpoint to continue from)")
    if every is not None and not path:
        raise UsageError("--checkpoint-every needs --state FILE")
    spec = (every or "60s").strip()
    try:
        value = float(spec[:-1]) if spec.endswith("s") else int(spec)
    except ValueError:
        value = 0
    if value <= 0:
        raise UsageError(f"--checkpoint-every {every}: expected a number of chunks (10) or seconds (60s)")
    if spec.endswith("s"):
        return Checkpoints(path, None, value, resume)
    return Checkpoints(path, int(value), float("inf"), resume)


def stopping_of(order: str | None, target_ci: float | None, min_chunks: int):
    """``--order``, ``--target-ci`` and ``--min-chunks`` as the run's window order and stopping rule."""
    from kldtool.pipeline.early_stop import Stopping
    from kldtool.text.window_order import parse_order

    visit = parse_order(order)
    if target_ci is not None and not visit.random:
        raise UsageError(
            f"--target-ci {target_ci}: needs --order random[:SEED]; a run stopped early in the file's order "
            "has measured only the corpus's beginning"
        )
    return visit, Stopping(target_ci, min_chunks)
