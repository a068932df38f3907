"""The compare flags that must agree with the base file, checked once it is open and before the
model loads (``check_file_flags``), and what they resolve to there: the windows to score and
the noise floor (``span_and_floor``)."""

from __future__ import annotations

from kldtool.engines import registry
from kldtool.errors import UsageError
from kldtool.pipeline.compat import file_protocol
from kldtool.text.protocols import parse_lengths


def span_and_floor(job, reader) -> tuple[tuple[int, int], dict | None]:
    """The windows ``job`` (a CompareJob) scores of ``reader``'s file, and its noise floor read
    and checked against that file (None without --noise-floor)."""
    from kldtool.pipeline.floor_file import load_floor

    span = parse_chunk_range(job.chunk_range, job.chunks, reader.header.n_chunk, reader.path)
    return span, (load_floor(job.noise_floor, reader) if job.noise_floor else None)


def check_file_flags(job, reader) -> tuple[tuple[int, int], dict | None]:
    """Every flag of ``job`` that must agree with ``reader``'s file checked, its output head
    found and checked (unless a server's workers read it); ``span_and_floor``'s answer."""
    server = registry.entry(job.engine.engine).server if job.engine and job.engine.engine else None
    served = server is not None and server.reads_base_there
    if served and job.head_from:
        raise UsageError(
            f"--head-from {job.head_from}: with --server the server's workers read the output head the base file names"
        )
    if not served:
        reader.use_head(job.head_from)  # an external head is found and checked now, before the model runs
    resolved = span_and_floor(job, reader)
    check_protocol_flags(reader, *job.protocol)
    return resolved


def check_protocol_flags(
    reader, name: str | None, ctx_size: int | None, stride: int | None, lengths: str | None
) -> None:
    """compare takes the protocol from the base file; flags that say otherwise are refused."""
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
