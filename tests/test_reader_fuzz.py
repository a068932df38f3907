"""The readers against lying headers and damaged bytes: our errors only, bounded memory.
A longer run of the same property: ``python scripts/fuzz_reader.py --examples 200000``."""

import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from kldtool.errors import TruncatedHeader
from kldtool.logitsfile import container, open_base_file
from reader_fuzz import check_reader_survives, mutated, seed_files

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return seed_files(str(tmp_path_factory.mktemp("seeds")))


def test_seeds_are_valid_files(seeds, tmp_path):
    for data in seeds.values():
        assert check_reader_survives(data, str(tmp_path)) == "ok"


@pytest.mark.parametrize("fmt", ["llamacpp", "kldtool", "kldtool-windows", "kldtool-frames", "kldtool-frames-windows"])
def test_lying_chunk_count_is_rejected_before_any_large_allocation(fixture_base, tmp_path, fmt):
    """n_chunk = 2^31 - 1 in front of a real file: refused from the file size alone (for a
    window-table container, before the table is read)."""
    real = fixture_base.read_bytes()[: 20 + 4 * 1024 + 10 * 98312]
    if fmt == "llamacpp":
        data = real[:16] + np.int32(2**31 - 1).tobytes() + real[20:]
    else:
        version, n_stream = {
            "kldtool": (1, 0),
            "kldtool-windows": (2, 1024),
            "kldtool-frames": (3, 0),
            "kldtool-frames-windows": (3, 1024),
        }[fmt]
        head = container.MAGIC + np.array([version, 128, 49152, 2**31 - 1, 1, n_stream], "<u4").tobytes()
        data = head + real[20:]
    path = tmp_path / "liar"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(
            TruncatedHeader, match="truncated window table" if fmt.endswith("windows") else "truncated token table"
        ):
            open_base_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated for a header promising 2^31-1 chunks"


def test_reader_fuzz(seeds, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("fuzz"))

    @settings(
        max_examples=400,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(mutated(seeds))
    def survives(data):
        check_reader_survives(data, directory)

    survives()
