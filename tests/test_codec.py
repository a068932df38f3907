"""The uint16 codec against llama.cpp's rules (docs/llama-perplexity-format.md §4.1) and its own torch/numpy twins."""

import numpy as np
import pytest
import torch

from kldtool.codec import (
    decode_np,
    decode_torch,
    encode_np,
    encode_torch,
    row_params_np,
    row_width,
    rows_to_numpy,
    rows_to_torch,
)

pytestmark = pytest.mark.quick


def _rows(seed=0, n=7, v=1001):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, v)) * 4).astype(np.float32)
    x[1] = 0.5  # all logits equal: scale 0, every code 0
    x[2, :] = rng.uniform(-3, 3, v).astype(np.float32)  # spread < 16: no clamp
    x[3, [5, 17]] = x[3].max() + 1  # tie for the top logit
    return x


def test_row_width_matches_llamacpp():
    assert row_width(49152) == 49156
    assert row_width(1001) == 1006  # odd V: one pad slot


def test_numpy_and_torch_encoders_agree_bit_for_bit():
    x = _rows()
    a, na = encode_np(x)
    b, nb = encode_torch(torch.from_numpy(x))
    assert np.array_equal(a, rows_to_numpy(b))
    assert np.array_equal(na, nb.numpy())


@pytest.mark.parametrize("codec", ["llamacpp", "grid"])
def test_the_compiled_replay_encoder_gives_numpys_rows(codec):
    """encode_compiled (the host's replay of hidden states) against encode_np, whose rows the
    parity tests hold to llama-perplexity's: the same bits, one row or many, a scale-0 row, a
    tie, an odd vocabulary, a row with a 40-nat spread (clamped)."""
    from kldtool.codec.rows_compiled import encode_compiled

    for x in (_rows(), _rows()[:1], _rows(1, 4, 49152), _rows(2, 85, 49151) * 3):
        a, na = encode_np(x, codec)
        b, nb = encode_compiled(x, codec, 16.0)
        assert np.array_equal(a, b) and np.array_equal(na, nb)


def test_encoding_follows_the_rules():
    x = _rows()
    rows, _ = encode_np(x)
    scale, mlp = row_params_np(rows)
    mx = x.max(1)
    mn = np.maximum(x.min(1), mx - np.float32(16))
    assert np.array_equal(scale, (mx - mn) / np.float32(65535))
    q = rows[:, 4 : 4 + x.shape[1]].astype(np.int64)
    live = scale != 0
    assert (q[live].max(1) == 65535).all()
    assert (q[~live] == 0).all()
    assert (q[x <= mn[:, None]] == 0).all()
    assert (rows[:, -1] == 0).all()  # pad slot of the odd vocabulary
    # decoded log-probs are within half a step of the exact float64 log-softmax above the floor
    ref = x.astype(np.float64) - mx[:, None] - np.log(np.exp(x.astype(np.float64) - mx[:, None]).sum(1))[:, None]
    dec = decode_np(rows, x.shape[1])
    above = (x > mn[:, None]) & live[:, None]
    err = np.abs(dec - ref)[above]
    assert err.max() <= (scale[live].max() * 0.5 + 1e-5)


def test_torch_decode_equals_numpy_decode():
    rows, _ = encode_np(_rows(3))
    assert np.array_equal(decode_np(rows, 1001), decode_torch(rows_to_torch(rows), 1001).numpy())


def test_fixture_rows_have_llamacpp_shape(fixture_base):
    from kldtool.logitsfile import open_base_file

    r = open_base_file(fixture_base)
    rows = r.read_chunk(3)
    scale, mlp = row_params_np(rows)
    # every row of a real model spans more than 16 nats: scale is exactly 16/65535
    assert np.all(scale == np.float32(16) / np.float32(65535))
    assert np.all((mlp <= -16.0) & (mlp > -30))
    assert np.all(rows[:, 4:].max(1) == 65535)
    r.close()


def _bf16_rows(seed=4, n=64, v=4099):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, v, generator=g) * 2.5
    x[:, 7] += 12  # a confident top token, as in real text
    return x.to(torch.bfloat16).to(torch.float32)


def test_grid_codec_numpy_and_torch_agree():
    x = _rows(5)
    a, na = encode_np(x, "grid")
    b, nb = encode_torch(torch.from_numpy(x), "grid")
    assert np.array_equal(a, rows_to_numpy(b)) and np.array_equal(na, nb.numpy())
    scale, _ = row_params_np(a)
    assert np.all(scale == np.float32(2.0**-12))


@pytest.mark.parametrize("codec, bound", [("grid", 1e-6), ("llamacpp", None)])
def test_bf16_logits_kld_floor(codec, bound):
    """A model against its own base rows: the grid codec is unbiased on bf16 logits; llama.cpp's
    range/65535 step decodes them systematically low (documented in codec/rows.py)."""
    from kldtool.reduce import reduce_rows

    x = _bf16_rows()
    rows, _ = encode_torch(x, codec)
    kld = reduce_rows(x, rows, torch.zeros(len(x), dtype=torch.int64)).kld
    print(codec, "mean self-KLD on bf16 logits:", kld.mean())
    if bound is not None:
        assert abs(kld.mean()) < bound
    else:
        assert kld.mean() < -5e-6  # the bias the grid codec removes


def test_grid_codec_keeps_the_clamped_tail_below_minus_16():
    """A row whose top token holds all but ~1e-5 of the mass: the grid window would decode the
    clamped tail above -16, where readers count it; such rows fall back to llama.cpp's step."""
    from kldtool.reduce import reduce_rows

    x = np.zeros((3, 500), np.float32)
    x[:, 0] = 30.0  # p(top) ~ 1 - 500 e^-30
    x[1, 1:] = np.linspace(-10, 10, 499)
    x[2, :] = np.random.default_rng(0).normal(size=500).astype(np.float32) * 3
    rows, _ = encode_np(x, "grid")
    dec = decode_np(rows, 500)
    codes = rows[:, 4:504]
    assert np.all(dec[codes == 0] <= -16)
    scale, _ = row_params_np(rows)
    assert scale[0] == np.float32(16) / np.float32(65535) and scale[2] == np.float32(2.0**-12)
    kld = reduce_rows(torch.from_numpy(x), rows_to_torch(rows), torch.zeros(3, dtype=torch.int64)).kld
    # a tail counted at -16 would add ~500 * e^-16 * 14 = 8e-4; what is left is the float32
    # rounding of llama.cpp's scale * 65535 on the top entry
    assert np.abs(kld).max() < 1e-5
