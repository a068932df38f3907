"""A compare run's files and what is computed from finished runs: results, per-token files and
state files read back and their statistics recomputed (results.py, per_token.py,
state_file.py: compare writes the latter two), paired comparisons (ordering.py, diff.py), and
the positions and windows where a quant departs most (worst.py). report/ renders it."""
