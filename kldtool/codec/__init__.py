"""Base rows as stored: log-probs <-> uint16 codes bit for bit as llama-perplexity writes them
(``rows``), compact top-K records (``topk``), and the base phase's encoding step (``encode``).
The reducers decode through this package; it imports nothing from them."""

from kldtool.codec.encode import encode_base_rows, target_nll
from kldtool.codec.rows import (
    CODE_MAX,
    CODECS,
    DEFAULT_CLAMP,
    HEADER_SLOTS,
    MAX_CLAMP,
    Coding,
    check_clamp,
    decode_np,
    decode_torch,
    encode_np,
    encode_torch,
    normalizer_np,
    normalizer_torch,
    row_params_np,
    row_width,
    rows_to_numpy,
    rows_to_torch,
)

__all__ = [
    "CODE_MAX",
    "CODECS",
    "DEFAULT_CLAMP",
    "HEADER_SLOTS",
    "MAX_CLAMP",
    "Coding",
    "check_clamp",
    "decode_np",
    "decode_torch",
    "encode_base_rows",
    "encode_np",
    "encode_torch",
    "normalizer_np",
    "normalizer_torch",
    "row_params_np",
    "row_width",
    "rows_to_numpy",
    "rows_to_torch",
    "target_nll",
]
