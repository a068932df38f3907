"""What a compare run opens itself, as the command named it (``CompareInputs``: the base file,
the engine's options, a noise floor of the file, an output head, the chunks, the protocol flags),
and the job those make once the file is open: every flag that must agree with the file is
checked there, before the model loads."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kldtool.engines import EngineOptions, registry
from kldtool.errors import UsageError
from kldtool.pipeline.compat import file_protocol
from kldtool.text.protocols import parse_lengths


@dataclass(kw_only=True, frozen=True)
class CompareInputs:
    base_path: str
    engine: EngineOptions
    noise_floor: str | None = None  # a noise-floor --json result of this base file
    head_from: str | None = None  # --head-from: where an external head is read from
    chunks: int | None = None  # --chunks N
    chunk_range: str | None = None  # --chunk-range A:B
    protocol: tuple = (None, None, None, None)  # --protocol, -c, --stride, --lengths as given


def against_file(job, reader):
    """``job`` (a CompareJob with ``inputs``) with what its inputs make of ``reader``'s file:
    the chunks to score and the noise floor, its head found and checked, the protocol flags
    refused where the file says otherwise."""
    from kldtool.pipeline.floor_file import load_floor

    given = job.inputs
    floor = load_floor(given.noise_floor, reader) if given.noise_floor else job.noise_floor
    served = registry.entry(given.engine.engine).reads_base_there if given.engine.engine else False
    if served and given.head_from:
        raise UsageError(
            f"--head-from {given.head_from}: with --server the server's workers read the output head the base file names"
        )
    if not served:
        reader.use_head(given.head_from)  # an external head is found and checked now, before the model runs
    span = parse_chunk_range(given.chunk_range, given.chunks, reader.header.n_chunk, given.base_path)
    check_protocol_flags(reader, *given.protocol)
    return replace(job, chunk_range=span, noise_floor=floor)


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
