"""Helpers of the compiled (numba) loops the codec, the reducer and llama.cpp's lanes share: the
vectorizable exponential (numba_exp.py) and whether a loop may spread over every core
(core_share.py)."""
