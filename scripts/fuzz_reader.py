"""Long fuzz run of the base-file readers (the property of tests/test_reader_fuzz.py, many more
examples, not derandomized). Prints how the examples ended; exits non-zero on the first
failure, which hypothesis shrinks and prints.

    .venv/bin/python scripts/fuzz_reader.py --examples 200000
"""

import argparse
import collections
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from hypothesis import HealthCheck, given, settings  # noqa: E402

from reader_fuzz import check_reader_survives, mutated, seed_files  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=20000)
    args = ap.parse_args()
    outcomes = collections.Counter()
    with tempfile.TemporaryDirectory() as d:
        seeds = seed_files(d)

        @settings(max_examples=args.examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(mutated(seeds))
        def survives(data):
            outcomes[check_reader_survives(data, d)] += 1

        survives()
    print(f"{sum(outcomes.values())} examples, all ended in a BaseFileError or a clean read:")
    for outcome, n in outcomes.most_common():
        print(f"{n:8d}  {outcome}")


if __name__ == "__main__":
    main()
