"""quantize / fake_quantize / QTensor: bit-exactness against NumPy oracles, layout, edge cases, errors."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp4jax
from fp4jax._src import hadamard, metrics
from fp4jax._src.quantize import packed_nbytes
from tests import numpy_reference as ref

NV, MX = fp4jax.NVFP4, fp4jax.MXFP4
KEY = jax.random.key(0)


def _edge_tensor(rows, cols, seed=0):
  """Gaussian rows of very different magnitudes plus values at ±1 ulp around E2M1 decision points of a block."""
  rng = np.random.RandomState(seed)
  x = rng.randn(rows, cols) * np.exp2(rng.uniform(-20, 20, (rows, 1)))
  x = x.astype(np.float32)
  x[0, :8] = [0, -0.0, 1e-30, -1e-30, 3e4, -3e4, 7.0, 0.5]
  return x


# slow tier; default representative: [shape3] (7 rows of 10 blocks, each row its own magnitude; the other shapes)
@pytest.mark.parametrize(
  "shape", [pytest.param(s, marks=pytest.mark.slow) for s in [(32, 64), (16, 16), (48, 304)]] + [(7, 160)]
)
def test_nvfp4_bit_exact_with_te_reference(shape):
  x = _edge_tensor(*shape)
  codes, dec, s_dec, deq = ref.nvfp4_reference(x)
  q = jax.jit(lambda a: fp4jax.quantize(a, NV))(x)
  np.testing.assert_array_equal(np.asarray(q.unpacked_codes()), codes)
  np.testing.assert_array_equal(np.asarray(q.scales).astype(np.float32), dec)
  np.testing.assert_array_equal(np.asarray(q.global_scale), s_dec)
  np.testing.assert_array_equal(np.asarray(q.dequantize(jnp.float32)), deq)
  np.testing.assert_array_equal(np.asarray(fp4jax.fake_quantize(x, NV)), deq)


def test_nvfp4_bit_exact_around_every_decision_point():
  """Values placed at ±1 ulp around every E2M1 bin edge of the scaled domain (TE's boundary test)."""
  edges = np.array([0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6], np.float32)
  # a block with max 6 has enc = 1 exactly when amax = 2688 (s_enc = 1, dec = 448, enc = 1/448 * 448 ... ) — use the
  # reference's own enc to place the points, then compare all steps bit for bit.
  base = np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, 10)])
  x = np.zeros((4, 48), np.float32)
  for r, scale in enumerate([1.0, 0.37, 1e-3, 12.5]):
    x[r, : base.size] = base * scale * np.where(np.arange(base.size) % 2, 1, -1)
  x[:, -1] = 6.0  # block max pins each last block's scale
  codes, dec, s_dec, deq = ref.nvfp4_reference(x)
  q = fp4jax.quantize(x, NV)
  np.testing.assert_array_equal(np.asarray(q.unpacked_codes()), codes)
  np.testing.assert_array_equal(np.asarray(q.dequantize(jnp.float32)), deq)


def test_nvfp4_zero_outlier_and_underflow():
  x = np.zeros((2, 48), np.float32)
  x[0, 0] = 1e6  # the outlier sets s_enc; the other blocks underflow their E4M3 scale to 0
  x[0, 16:32] = 1e-3
  x[1, :16] = 5e-2
  q = fp4jax.quantize(x, NV)
  codes, dec, s_dec, deq = ref.nvfp4_reference(x)
  np.testing.assert_array_equal(np.asarray(q.unpacked_codes()), codes)
  d = np.asarray(q.dequantize(jnp.float32))
  np.testing.assert_array_equal(d, deq)
  assert np.all(d[0, 16:] == 0) and np.all(np.asarray(q.scales).astype(np.float32)[0, 1:] == 0)
  assert np.all(np.asarray(q.unpacked_codes())[0, 32:] == 0)  # all-zero block: codes 0
  z = fp4jax.quantize(jnp.zeros((3, 32)), NV)
  assert float(z.global_scale) == 1.0 and not np.any(np.asarray(z.dequantize()))


def _mx_reference(x, mode):
  x = x.astype(np.float32)
  xb = x.reshape(x.shape[0], -1, 32)
  amax = np.max(np.abs(xb), -1, keepdims=True)
  with np.errstate(divide="ignore"):
    if mode == "floor":
      e = np.floor(np.log2(amax.astype(np.float64))) - 2
    else:
      e = np.ceil(np.log2(amax.astype(np.float64) / 6))
  e = np.where(amax == 0, -127, np.clip(e, -127, 127))
  v = np.clip(xb / np.exp2(e), -6, 6).astype(np.float32)
  codes = ref.e2m1_codes(v)
  return codes.reshape(x.shape), e[..., 0], (ref.e2m1_values(codes) * np.exp2(e)).reshape(x.shape)


@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_mxfp4_matches_reference(mode):
  rng = np.random.RandomState(1)
  x = (rng.randn(24, 96) * np.exp2(rng.uniform(-30, 30, (24, 1)))).astype(np.float32)
  x[3, :32] = 0
  fmt = dataclasses.replace(MX, scale_mode=mode)
  q = fp4jax.quantize(x, fmt)
  codes, e, deq = _mx_reference(x, mode)
  np.testing.assert_array_equal(np.asarray(q.unpacked_codes()), codes)
  bits = np.asarray(q.scales).view(np.uint8).astype(np.int64)
  np.testing.assert_array_equal(bits - 127, e)
  assert bits[3, 0] == 0  # all-zero block: smallest scale
  np.testing.assert_array_equal(np.asarray(q.dequantize(jnp.float32)), deq.astype(np.float32))
  if mode == "rceil":  # no clipping: |x| <= 6 * 2^e
    assert np.all(np.abs(x.reshape(24, 3, 32)) <= 6 * np.exp2(e)[..., None])


def test_mxfp4_floor_headroom_never_clips_and_decodes_with_4_3():
  x = np.random.RandomState(2).randn(8, 64).astype(np.float32)
  fmt = dataclasses.replace(MX, scale_mode="floor_headroom")
  q = fp4jax.quantize(x, fmt)
  assert float(q.global_scale) == np.float32(4 / 3)
  e = np.asarray(q.scales).view(np.uint8).astype(np.int64) - 127
  v = 0.75 * np.abs(x.reshape(8, 2, 32)) / np.exp2(e)[..., None]
  assert v.max() < 6 and np.all(v.max(-1) >= 3)


# slow tier; default representative: [fmt3--2-shape3] (NVFP4 along the middle axis of a 3D tensor, 20 -> 32)
@pytest.mark.parametrize(
  "fmt,axis,shape",
  [
    pytest.param(NV, -1, (5, 37), marks=pytest.mark.slow),
    pytest.param(NV, 0, (37, 5), marks=pytest.mark.slow),
    pytest.param(MX, 1, (2, 70, 3), marks=pytest.mark.slow),
    (NV, -2, (3, 20, 9)),
  ],
)
def test_ragged_lengths_are_zero_padded_and_cropped(fmt, axis, shape):
  x = np.random.RandomState(3).randn(*shape).astype(np.float32)
  q = fp4jax.quantize(x, fmt, axis=axis)
  n = shape[axis]
  padded = -(-n // fmt.block_size) * fmt.block_size
  assert q.codes.shape[axis] == padded // 2 and q.scales.shape[axis] == padded // fmt.block_size
  y = np.asarray(q.dequantize(jnp.float32))
  assert y.shape == shape
  # Same numbers as quantizing the explicitly zero-padded tensor and cropping.
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, padded - n)
  yp = np.asarray(fp4jax.fake_quantize(np.pad(x, pad), fmt, axis=axis))
  np.testing.assert_array_equal(y, np.take(yp, np.arange(n), axis=axis))


def test_packing_even_element_in_low_nibble():
  x = jnp.array([[1.0, -6.0] + [0.0] * 14], jnp.float32) * 6  # amax 36; block max -> 6
  q = fp4jax.quantize(x, NV)
  c = np.asarray(q.unpacked_codes())[0]
  assert np.asarray(q.codes)[0, 0] == c[0] | (c[1] << 4)
  assert (c[0], c[1]) == (2, 15)


def test_qtensor_is_a_pytree_and_jits():
  x = jnp.asarray(np.random.RandomState(4).randn(16, 64), jnp.bfloat16)
  q = jax.jit(lambda a: fp4jax.quantize(a, NV, rounding="sr", key=KEY))(x)
  leaves, tree = jax.tree_util.tree_flatten(q)
  q2 = jax.tree_util.tree_unflatten(tree, leaves)
  assert q2.dtype == jnp.bfloat16 and q2.dequantize().dtype == jnp.bfloat16
  np.testing.assert_array_equal(
    np.asarray(jax.jit(lambda t: t.dequantize(jnp.float32))(q2)), np.asarray(q.dequantize(jnp.float32))
  )
  assert packed_nbytes(q) == 16 * 32 + 16 * 4 + 4


# slow tier; default representative: [absmax] (four-over-six's scale choice: tests/test_oracles_numerics.py)
@pytest.mark.parametrize("fmt_mode", ["absmax", pytest.param("four_over_six", marks=pytest.mark.slow)])
def test_2d_blocks_quantize_w_and_wt_identically(fmt_mode):
  w = np.random.RandomState(5).randn(40, 72).astype(np.float32)
  fmt = dataclasses.replace(NV, scale_mode=fmt_mode)
  a = np.asarray(fp4jax.fake_quantize(w, fmt, block_shape=(16, 16), axis=-1))
  b = np.asarray(fp4jax.fake_quantize(w.T, fmt, block_shape=(16, 16), axis=-1)).T
  c = np.asarray(fp4jax.fake_quantize(w, fmt, block_shape=(16, 16), axis=0))
  np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(a, c)
  q = fp4jax.quantize(w, fmt, block_shape=(16, 16))
  assert q.scales.shape == (3, 5)
  # One scale per 16x16 tile: every element's |x| <= its tile's amax maps within the scale's range.
  np.testing.assert_array_equal(np.asarray(q.dequantize(jnp.float32)), a)


# slow tier; default representative: [kwargs3] (the rotated=True branch too); RTN and SR with a key: the quantizer
# tests of test_public_variants.py (dequantize(quantize(x)) and fake_quantize(x), each the oracle's bits)
@pytest.mark.parametrize(
  "kwargs",
  [
    pytest.param(dict(rounding="rtn"), marks=pytest.mark.slow),
    pytest.param(dict(rounding="sr", key=KEY), marks=pytest.mark.slow),
    pytest.param(dict(rounding="eden", key=KEY), marks=pytest.mark.slow),
    dict(rounding="rtn", hadamard=16, hadamard_signs="te"),
    pytest.param(dict(rounding="sr", hadamard=32, key=KEY, fmt=MX), marks=pytest.mark.slow),
    pytest.param(
      dict(rounding="rtn", fmt=dataclasses.replace(MX, scale_mode="quest"), hadamard=32, hadamard_signs="none"),
      marks=pytest.mark.slow,
    ),
    pytest.param(dict(rounding="rtn", fmt=dataclasses.replace(NV, scale_mode="four_over_six")), marks=pytest.mark.slow),
  ],
)
def test_dequantize_equals_fake_quantize_and_same_key_same_bits(kwargs):
  fmt = kwargs.pop("fmt", NV)
  x = jnp.asarray(np.random.RandomState(6).randn(8, 256), jnp.float32)
  q = fp4jax.quantize(x, fmt, **kwargs)
  y = fp4jax.fake_quantize(x, fmt, **kwargs)
  np.testing.assert_array_equal(np.asarray(q.dequantize()), np.asarray(y))
  np.testing.assert_array_equal(np.asarray(fp4jax.fake_quantize(x, fmt, **kwargs)), np.asarray(y))
  assert np.asarray(q.dequantize()).dtype == np.float32
  if q.hadamard:
    np.testing.assert_array_equal(
      np.asarray(q.dequantize(rotated=True)), np.asarray(fp4jax.fake_quantize(x, fmt, rotated=True, **kwargs))
    )


# slow tier; default representative: test_public_variants.py's test_quantize_and_fake_quantize_mxfp4_sr_match_ocp_*
# (every SR decision is the key's bits, bits.random_bits: the same draw for NVFP4) and test_dot.py's random-recipe keys
@pytest.mark.slow
def test_different_keys_give_different_bits():
  x = jnp.asarray(np.random.RandomState(7).randn(8, 64), jnp.float32)
  a = fp4jax.fake_quantize(x, NV, rounding="sr", key=jax.random.key(1))
  b = fp4jax.fake_quantize(x, NV, rounding="sr", key=jax.random.key(2))
  assert not np.array_equal(np.asarray(a), np.asarray(b))


def test_te_rht_matches_matrix_definition_and_rounds_bf16_once():
  x = jnp.asarray(np.random.RandomState(8).randn(4, 64), jnp.bfloat16)
  t = np.diag(hadamard.TE_SIGNS_16) @ (hadamard.hadamard_matrix(16) * 4) * 0.25
  y_ref = (np.asarray(x, np.float64).reshape(4, 4, 16) @ t).reshape(4, 64)
  q = fp4jax.quantize(x, NV, hadamard=16, hadamard_signs="te")
  rotated_input = np.asarray(y_ref.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32))
  expect = ref.nvfp4_reference(rotated_input)[3]
  np.testing.assert_array_equal(np.asarray(q.dequantize(jnp.float32, rotated=True)), expect)


# slow tier; default representative: [fmt0-float32-16] and [fmt1-float32-16] (NVFP4's tensor scale, MXFP4's block)
@pytest.mark.parametrize("hadamard_size", [pytest.param(None, marks=pytest.mark.slow), 16])
@pytest.mark.parametrize("dtype", [np.float32, pytest.param(jnp.bfloat16, marks=pytest.mark.slow)])
@pytest.mark.parametrize("fmt", [NV, MX])
def test_nan_and_inf_never_become_finite(fmt, dtype, hadamard_size):
  x = np.random.RandomState(9).randn(4, 64).astype(np.float32)
  for bad in (np.nan, np.inf, -np.inf):
    xb = x.copy()
    xb[1, 5] = bad
    y = np.asarray(
      fp4jax.fake_quantize(
        jnp.asarray(xb, dtype), fmt, hadamard=hadamard_size, hadamard_signs="te" if hadamard_size else "random"
      ),
      np.float32,
    )
    assert np.isnan(y[1, 5])
    if fmt is MX:  # per-block scale: only the poisoned block is NaN
      assert np.all(np.isnan(y[1, :32])) and np.all(np.isfinite(y[1, 32:])) and np.all(np.isfinite(y[0]))
    else:  # the tensor amax is non-finite: the tensor scale is NaN
      assert np.all(np.isnan(y))


@pytest.mark.parametrize(
  "call,match",
  [
    (lambda: fp4jax.quantize(jnp.arange(32), NV), "x must be a floating-point"),
    (lambda: fp4jax.quantize(jnp.ones((4, 32)), NV, axis=2), "axis"),
    (lambda: fp4jax.quantize(jnp.ones((4, 32)), NV, rounding="sr"), "key"),
    (lambda: fp4jax.quantize(jnp.ones((4, 32)), NV, rounding="eden"), "key"),
    (lambda: fp4jax.quantize(jnp.ones((4, 32)), NV, hadamard=16), "key"),
    (lambda: fp4jax.quantize(jnp.ones((32,)), NV, block_shape=(16, 16)), "block_shape"),
    (lambda: fp4jax.quantize(jnp.ones((4, 32)), MX, block_shape=(16, 16)), "block_shape"),
    (lambda: fp4jax.quantize(jnp.ones((4, 32)), NV, rounding="nearest"), "rounding"),
    (
      lambda: fp4jax.quantize(jnp.ones((4, 40)), NV, hadamard=16, hadamard_signs="none"),
      "Hadamard size 16 must divide",
    ),
    (lambda: fp4jax.quantize(jnp.ones((4, 32)), "nvfp4"), "fmt"),
    (lambda: fp4jax.quantize(jnp.ones((4, 32)), MX, rounding="eden", key=KEY), "eden"),
    (lambda: dataclasses.replace(NV, scale_mode="floor"), "scale_mode"),
  ],
)
def test_bad_arguments_raise_clear_errors(call, match):
  with pytest.raises((ValueError, TypeError), match=match):
    call()


# slow tier; default representative: tests/test_oracles_numerics.py's QuEST scales (test_quest_scales_a_block_whose_*,
# test_mx_exponents_equal_the_oracle_at_their_boundaries[quest], [quest_nearest])
@pytest.mark.slow
def test_quest_scales_reproduce_published_relative_mse():
  """QuEST on N(0,1) after H32: floor-rounded scale ≈ 27.4e-3, nearest power of two ≈ 12.7e-3 (FP4-REFERENCE §4)."""
  x = jax.random.normal(jax.random.key(10), (512, 1024))
  for mode, expect in [("quest", 27.4e-3), ("quest_nearest", 12.7e-3)]:
    y = fp4jax.fake_quantize(x, dataclasses.replace(MX, scale_mode=mode), hadamard=32, hadamard_signs="none")
    assert abs(float(metrics.relative_mse(x, y)) / expect - 1) < 0.08, (mode, float(metrics.relative_mse(x, y)))


@pytest.mark.parametrize(
  "shape,axis,block", [((3, 70), 1, (32,)), ((37, 5), 0, (16,)), ((20, 40), 1, (16, 16)), ((40, 20), 0, (16, 16))]
)
def test_valid_counts_match_padding(shape, axis, block):
  from fp4jax._src.quantize import BlockLayout

  lay = BlockLayout(shape, axis, block)
  expect = jnp.sum(lay.to_blocks(jnp.ones(shape, jnp.float32)), axis=lay.red_axes, keepdims=True)
  np.testing.assert_array_equal(np.asarray(lay.valid_counts() * jnp.ones_like(expect)), np.asarray(expect))


def test_ms_eden_blocks_whose_scale_underflows_dequantize_to_zero_not_nan():
  """Regression: an outlier sets the tensor scale; tiny blocks get an E4M3 scale of 0, which EDEN must keep."""
  x = np.zeros((2, 128), np.float32)
  x[0, 0] = 1e3
  x[1, :] = 1e-9 * np.arange(1, 129)
  y = np.asarray(fp4jax.fake_quantize(x, NV, rounding="eden", key=KEY, hadamard=None))
  assert np.all(np.isfinite(y)) and np.all(y[1] == 0)
  q = fp4jax.quantize(x, NV, rounding="eden", key=KEY, hadamard=None)
  assert np.all(np.asarray(q.scales).astype(np.float32)[1] == 0)


@pytest.mark.parametrize("fn", [fp4jax.quantize, fp4jax.fake_quantize])
def test_empty_x_raises_naming_x_and_its_shape(fn):
  with pytest.raises(ValueError, match=r"x of shape \(4, 0\) is empty"):
    fn(jnp.ones((4, 0)), NV)


@pytest.mark.parametrize("fn", [fp4jax.quantize, fp4jax.fake_quantize])
@pytest.mark.parametrize("axis", [1.0, "1", True, None])
def test_non_int_axis_raises_type_error_naming_axis(fn, axis):
  with pytest.raises(TypeError, match="axis must be an int"):
    fn(jnp.ones((4, 32)), NV, axis=axis)


@pytest.mark.parametrize("fn", [fp4jax.quantize, fp4jax.fake_quantize])
@pytest.mark.parametrize("block_shape", [16, (16.0,), "16"])
def test_block_shape_not_a_tuple_of_ints_raises_type_error(fn, block_shape):
  with pytest.raises(TypeError, match="block_shape must be None or a tuple of ints"):
    fn(jnp.ones((4, 32)), NV, block_shape=block_shape)


def test_array_likes_are_accepted_by_quantize_and_fake_quantize_alike():
  """A Python list (and a NumPy array) quantizes as the float32 array it converts to: the TE-order NumPy oracle."""
  x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
  _, _, _, want = ref.nvfp4_reference(x)
  for arg in (x.tolist(), x):
    q = fp4jax.quantize(arg, NV, hadamard=0)
    assert q.shape == (2, 32) and q.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(q.dequantize()), want)
    np.testing.assert_array_equal(np.asarray(fp4jax.fake_quantize(arg, NV, hadamard=0)), want)


def test_dot_general_and_einsum_take_array_likes():
  x, w = np.ones((16, 32), np.float32).tolist(), np.ones((8, 32), np.float32).tolist()
  y = fp4jax.dot_general(x, w, (((1,), (1,)), ((), ())), recipe="nvfp4_rtn")
  np.testing.assert_array_equal(np.asarray(y), np.full((16, 8), 32.0))  # ones quantize exactly
  y = fp4jax.einsum("mk,nk->mn", x, w, recipe="nvfp4_rtn")
  np.testing.assert_array_equal(np.asarray(y), np.full((16, 8), 32.0))
