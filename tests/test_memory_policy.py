"""The allocation policy (kldtool/runtime/memory.py) in a process of its own, as the CLI sets it: under
heap a buffer freed and allocated again faults no page, under mmap it faults every page on
every use; an unknown KLDTOOL_MALLOC value leaves the allocator alone, and the CLI refuses it."""

import json
import os
import subprocess
import sys

import pytest

from conftest import run_cli

pytestmark = [pytest.mark.quick, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")]

# 8 rounds of a 64 MiB buffer allocated, written whole and freed: the faults of rounds 2-8.
PROBE = """
import json, resource, sys
import numpy as np
from kldtool.runtime.memory import set_malloc_policy
policy = set_malloc_policy(None)
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.empty(64 << 20, np.uint8)
    a.fill(1)
    del a
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"policy": policy, "faults": sum(faults[1:])}))
"""


def probe(value: str | None) -> dict:
    env = {"KLDTOOL_MALLOC": value} if value else {}
    p = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env={**os.environ, **env}, timeout=120
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_heap_reuses_a_freed_buffer_and_mmap_faults_it_in_again():
    # A fresh mapping faults at least once per 2 MiB (numpy asks for huge pages), 32 times a round.
    fresh = 7 * (64 << 20) // (2 << 20)
    heap, mmap, default = probe("heap"), probe("mmap"), probe(None)
    print("faults over 7 rounds of 64 MiB:", heap, mmap, default)
    assert heap["policy"] == default["policy"] == "heap" and mmap["policy"] == "mmap"
    assert mmap["faults"] >= fresh
    assert heap["faults"] * 50 <= mmap["faults"] and default["faults"] * 50 <= mmap["faults"]


def test_an_unknown_policy_changes_nothing_and_the_cli_refuses_it():
    assert probe("tcmalloc")["policy"] is None
    p = run_cli("info", "--help", check_rc=2, env_extra={"KLDTOOL_MALLOC": "tcmalloc"})
    assert p.stderr.splitlines() == ["kldtool: error: KLDTOOL_MALLOC='tcmalloc': expected heap, mmap, glibc"]
