"""Backward rules: DGE, OCC, trust mask; the GEMM operand quantizers (FP4 blocks, FP8 current scaling, E2M1 per row)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4jax._src import estimators, fp8
from fp4jax._src.formats import E2M1_CHANNEL, E2M1_VALUES, MXFP4, NVFP4
from fp4jax._src.operand import channel_scale, quantize_operand
from fp4jax._src.quantize import quantize
from fp4jax._src.recipes import OperandSpec, quartet
from tests import oracles


def _smooth_step(x, k):
  """Microsoft FP4's smooth E2M1 quantizer on magnitudes (the function whose derivative DGE uses)."""
  a = np.abs(x)
  delta = np.where(a < 2, 0.5, np.where(a < 4, 1.0, 2.0))
  lo = np.where(a < 2, np.floor(a / 0.5) * 0.5, np.where(a < 4, 2 + np.floor(a - 2), 4.0))
  t = 2 * (a - lo) / delta - 1
  return lo + delta / 2 * (1 + np.sign(t) * np.abs(t) ** (1 / k))


def test_dge_matches_ms_amp_check_at_minus_six():
  assert float(estimators.dge_derivative(jnp.float32(-6.0), k=5.0)) == pytest.approx(0.2002, abs=5e-4)


def test_dge_is_the_derivative_of_the_smooth_quantizer():
  # Points inside intervals, away from the capped midpoints.
  x = np.array([0.1, 0.37, 0.6, 1.1, 1.4, 1.9, 2.2, 2.8, 3.3, 3.9, 4.3, 5.5, 5.95], np.float64)
  h = 1e-5
  numeric = (_smooth_step(x + h, 5) - _smooth_step(x - h, 5)) / (2 * h)
  got = np.asarray(estimators.dge_derivative(jnp.asarray(x, jnp.float32), k=5.0, cap=1e9))
  np.testing.assert_allclose(got, numeric, rtol=1e-3)
  np.testing.assert_array_equal(
    estimators.dge_derivative(-jnp.asarray(x, jnp.float32)), estimators.dge_derivative(jnp.asarray(x, jnp.float32))
  )


def test_dge_cap_and_grid_points():
  grid = jnp.asarray(E2M1_VALUES[1:])
  np.testing.assert_allclose(estimators.dge_derivative(grid, k=5.0), 0.2, rtol=1e-6)  # f' = 1/k on the grid
  midpoints = jnp.asarray([0.25, 1.75, 2.5, 3.5, 5.0])
  np.testing.assert_array_equal(estimators.dge_derivative(midpoints, k=5.0, cap=3.0), 3.0)
  assert np.isnan(estimators.dge_derivative(jnp.float32(jnp.nan)))
  with pytest.raises(ValueError, match="k must be > 1"):
    estimators.dge_derivative(grid, k=1.0)


@pytest.mark.parametrize("k, cap", [(1.5, 3.0), (3.0, 2.0), (5.0, 1e9)])
def test_dge_for_other_sharpness_and_caps_matches_the_numpy_oracle(k, cap):
  """Any k > 1 is accepted (Eq. 8 of arXiv 2501.17116): values inside, at the ends and past 6 of every interval."""
  x = np.concatenate([np.linspace(-7.0, 7.0, 561), [0.0, 0.5, 2.0, 4.0, 6.0, 1.9, 3.9]]).astype(np.float32)
  np.testing.assert_allclose(
    estimators.dge_derivative(jnp.asarray(x), k=k, cap=cap), oracles.dge_derivative(x, k=k, cap=cap), rtol=2e-6
  )


def test_dge_is_differentiable_with_zero_slope_where_it_is_capped():
  """Around an interval midpoint f' is the constant cap, so its derivative is 0 (not the NaN of an infinite
  power masked afterwards); inside the uncapped part it is the finite slope of (1/k)·|2u/δ − 1|^(1/k − 1)."""
  mid = jnp.asarray([0.25, 0.75, 1.25, 2.5, 3.5, 5.0], jnp.float32)
  slope = jax.vmap(jax.grad(lambda v: estimators.dge_derivative(v, k=5.0, cap=3.0)))(mid)
  np.testing.assert_array_equal(slope, 0.0)
  x = 2.2  # interval [2, 3], delta 1: t = 1 - 2u with u = 0.2, so t = 0.6 and dt/dx = -2
  expect = (1 / 5) * (1 / 5 - 1) * 0.6 ** (1 / 5 - 2) * -2.0
  assert float(jax.grad(lambda v: estimators.dge_derivative(v, k=5.0, cap=3.0))(jnp.float32(x))) == pytest.approx(
    expect, rel=1e-5
  )


def _numpy_rank(x, rank):
  """Value at ``rank`` of each row sorted ascending (NumPy), keepdims; zeros returned as +0."""
  return np.sort(np.asarray(x, np.float64), axis=-1)[..., rank : rank + 1] + 0.0


def test_occ_defaults_clamp_the_last_axis_to_the_0_99_quantiles():
  """occ_clamp(x) and occ_bounds(x, q): quantile 0.99 and the last axis by default, also for 3-d activations."""
  rng = np.random.default_rng(7)
  x = rng.standard_normal((2, 3, 200)).astype(np.float32)
  lo, hi = _numpy_rank(x, 2), _numpy_rank(x, 198)  # floor(0.01 * 200), floor(0.99 * 200)
  xc, r = estimators.occ_clamp(jnp.asarray(x))
  np.testing.assert_array_equal(xc, np.clip(x, lo, hi))
  np.testing.assert_array_equal(r, x - np.clip(x, lo, hi))
  got_lo, got_hi = estimators.occ_bounds(jnp.asarray(x), 0.99)
  np.testing.assert_array_equal(got_lo, lo)
  np.testing.assert_array_equal(got_hi, hi)


def test_select_ranks_of_small_integers_and_signed_zeros_on_batched_rows():
  """Every rank of rows with ties, ±1 and ±0 (returned as +0), batched (2, 3, n): ranks are checked against the
  last axis's length only."""
  row = np.array([1.0, -0.0, 0.0, -1.0, 1.0, 2.0, -0.0, 3.0, 1.0, -2.0, 0.0, 1.0], np.float32)
  x = np.stack([np.stack([np.roll(row, i + 3 * j) * (1 + j) for i in range(3)]) for j in range(2)])
  ranks = tuple(range(row.size))
  for got, rank in zip(estimators.select_ranks(jnp.asarray(x), ranks), ranks):
    expect = _numpy_rank(x, rank)
    np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(np.signbit(np.asarray(got)), np.signbit(expect))


def test_occ_residual_is_zero_when_nothing_exceeds_the_quantiles():
  # Each row of 200 has its 3 smallest and 3 largest values tied, so the quantile bounds equal min and max.
  row = np.concatenate([[-5.0] * 3, np.linspace(-1, 1, 194), [4.0] * 3]).astype(np.float32)
  x = jnp.asarray(np.stack([row, 2 * row]))
  xc, r = estimators.occ_clamp(x, 0.99)
  np.testing.assert_array_equal(xc, x)
  np.testing.assert_array_equal(r, 0.0)


def test_occ_residual_holds_exactly_the_outliers():
  x = jax.random.normal(jax.random.key(0), (4, 200))
  x = x.at[1, 7].set(50.0).at[2, 9].set(-40.0)
  xc, r = estimators.occ_clamp(x, 0.99)
  lo, hi = estimators.occ_bounds(x, 0.99)
  np.testing.assert_array_equal(xc + r, x)
  np.testing.assert_array_equal(r != 0, (x > hi) | (x < lo))
  # 0.99 of 200: order statistics 2 and 198, so 2 clamped at the bottom and 1 at the top of every row.
  np.testing.assert_array_equal(np.sum(np.asarray(r) != 0, axis=1), [3, 3, 3, 3])
  assert float(r[1, 7]) == pytest.approx(50.0 - float(hi[1, 0]))


def _sorted_rank(x, rank, axis):
  return jax.lax.slice_in_dim(jnp.sort(x, axis=axis), rank, rank + 1, axis=axis % x.ndim)


def _occ_cases():
  """(n, dtype): by default one row of 1 (bfloat16) and rows of 4099 (float32, every radix pass)."""
  slow = pytest.mark.slow  # slow tier; default representative: [1-bfloat16] and [4099-float32]
  dtypes = (jnp.bfloat16, jnp.float16, jnp.float32)
  keep = {(1, jnp.bfloat16), (4099, jnp.float32)}
  return [
    pytest.param(n, d, marks=() if (n, d) in keep else slow, id=f"{n}-{jnp.dtype(d).name}")
    for n in (1, 7, 200, 4099)
    for d in dtypes
  ]


@pytest.mark.parametrize("n, dtype", _occ_cases())
def test_occ_bounds_are_the_sorted_rows_order_statistics(dtype, n):
  """The radix select gives the values a sort puts at the bound ranks: ties, ±0 (equal), ±Inf, NaN (after +Inf)."""
  rng = np.random.default_rng(n)
  x = rng.standard_normal((6, n)) * np.exp2(rng.integers(-12, 12, (6, n)))
  x[rng.random(x.shape) < 0.2] = 0.0
  x[rng.random(x.shape) < 0.2] *= -1.0  # -0.0 among the zeros
  x[1] = np.round(x[1])  # many ties
  x[2, : n // 2 + 1] = np.nan  # NaN reaches the high rank
  x[3, 0], x[3, -1] = np.inf, -np.inf
  x[4, :] = -np.inf
  x[5, n // 3] = np.nan  # one NaN: finite bounds (for n >= 200)
  x = jnp.asarray(x, dtype)
  for q in (0.99, 0.9, 0.51, 1.0):
    lo, hi = estimators.occ_bounds(x, q)
    ranks = (int((1.0 - q) * n), min(int(q * n), n - 1))
    np.testing.assert_array_equal(np.asarray(lo, np.float32), np.asarray(_sorted_rank(x, ranks[0], -1), np.float32))
    np.testing.assert_array_equal(np.asarray(hi, np.float32), np.asarray(_sorted_rank(x, ranks[1], -1), np.float32))
  lo, hi = estimators.occ_bounds(x.T, 0.99, axis=0)  # along a leading axis
  assert lo.shape == (1, 6)
  np.testing.assert_array_equal(
    np.asarray(hi, np.float32), np.asarray(_sorted_rank(x.T, min(int(0.99 * n), n - 1), 0), np.float32)
  )


@pytest.mark.parametrize("radix_bits", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_select_ranks_is_exact_at_every_radix(radix_bits, dtype):
  x = jnp.asarray(np.random.default_rng(1).standard_normal((5, 300)), dtype).at[0, :7].set(-0.0)
  ranks = (0, 3, 150, 299)
  for got, rank in zip(estimators.select_ranks(x, ranks, radix_bits=radix_bits), ranks):
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(_sorted_rank(x, rank, -1), np.float32))


def test_select_ranks_default_digit_width_is_one_bit_for_16_bit_keys_and_two_for_32():
  assert [estimators.default_radix_bits(n) for n in (8, 16, 32, 64)] == [1, 1, 2, 2]


def test_select_ranks_checks_its_ranks():
  with pytest.raises(ValueError, match=r"ranks must lie in \[0, 5\)"):
    estimators.select_ranks(jnp.zeros((2, 5)), (5,))


def test_trust_mask_boundary():
  s = jnp.float32(0.25)
  x = jnp.asarray([0.0, 1.49, -1.4999999, 1.5, -1.5, 2.0], jnp.float32)
  np.testing.assert_array_equal(estimators.trust_mask(x, s), [True, True, True, False, False, False])


# slow tier; default representative: test_trust_mask_boundary (the mask's rule) and
# test_oracles_dot.py::test_forward_and_gradients_equal_the_numpy_oracle[quartet] (quartet's masked dX, bit for bit)
@pytest.mark.slow
def test_quartet_trust_mask_marks_exactly_the_saturated_elements():
  spec = quartet().fwd_lhs
  x = jax.random.normal(jax.random.key(1), (8, 64)).at[0, 3].set(30.0)
  _, mask = quantize_operand(x, spec, None)
  s = np.repeat(np.asarray(quantize(x, spec.fmt, hadamard=0).scale_values()), 32, axis=-1)
  a, mask = np.abs(np.asarray(x)), np.asarray(mask)
  np.testing.assert_array_equal(mask, a < 6 * s)
  assert not mask[0, 3]
  assert 0.85 < float(np.mean(mask)) < 1.0  # QuEST's clip (1.46..2.92 σ) cuts a few percent


@pytest.mark.parametrize("name, grid_max", [("fp8_e4m3", 448.0), ("fp8_e5m2", 57344.0)])
def test_fp8_current_scaling(name, grid_max):
  x = jax.random.normal(jax.random.key(2), (64, 64)) * 3.0
  v, inv = fp8.quantize_fp8(x, {"fp8_e4m3": fp8.E4M3, "fp8_e5m2": fp8.E5M2}[name])
  v, x = np.asarray(v), np.asarray(x)
  assert np.max(np.abs(v)) == grid_max  # amax maps to the largest finite value
  # Every value is on the FP8 grid: exactly representable in the ml_dtypes type.
  np.testing.assert_array_equal(
    v.astype(jnp.dtype(f"float8_{name[4:]}{'fn' if name == 'fp8_e4m3' else ''}")).astype(np.float32), v
  )
  rel = np.abs(v * float(inv) - x) / np.abs(x)
  step = 2.0 ** -(4 if name == "fp8_e4m3" else 3)  # half a mantissa ulp, normal range
  assert np.max(rel[np.abs(x) > 0.1]) <= step * (1 + 1e-6)


def test_fp8_rounding_ties_to_even_and_specials():
  e5m2 = fp8.rtn_e5m2(jnp.asarray([1.125, 1.375, 1.0625, 60000.0, -1e9, 2.0**-17, 3 * 2.0**-17, jnp.nan]))
  np.testing.assert_array_equal(e5m2[:7], [1.0, 1.5, 1.0, 57344.0, -57344.0, 0.0, 2.0**-15])
  assert np.isnan(e5m2[7])
  v, inv = fp8.quantize_fp8(jnp.asarray([1.0, jnp.inf]), fp8.E4M3)
  assert np.all(np.isnan(np.asarray(v) * float(inv)))  # a non-finite amax gives NaN, never a finite number
  v, inv = fp8.quantize_fp8(jnp.zeros(4), fp8.E5M2)
  np.testing.assert_array_equal(np.asarray(v) * float(inv), 0.0)


@pytest.mark.parametrize("pow2", [False, True])
def test_e2m1_channel_operand(pow2):
  x = jax.random.normal(jax.random.key(3), (8, 40))
  op, _ = quantize_operand(x, OperandSpec(fmt=E2M1_CHANNEL, scale_pow2=pow2), None)
  g = np.asarray(channel_scale(x, pow2))
  # values: E2M1 grid values of x·γ (exact in bf16); scale: one decode scale 1/γ per row
  assert op.values.dtype == jnp.bfloat16 and op.scale.shape == (8, 1)
  nearest = E2M1_VALUES[np.argmin(np.abs(np.abs(np.asarray(x) * g)[..., None] - E2M1_VALUES), axis=-1)]
  np.testing.assert_array_equal(np.abs(np.asarray(op.values, np.float32)), nearest)
  np.testing.assert_array_equal(op.scale, np.float32(1.0) / g)
  np.testing.assert_array_equal(op.dequantize(), np.asarray(op.values, np.float32) * (np.float32(1.0) / g))
  if pow2:
    assert np.all(np.log2(g) == np.round(np.log2(g)))
    assert np.all(np.max(np.abs(np.asarray(x)) * g, axis=1) <= 6.0)
  else:
    np.testing.assert_array_equal(np.max(np.abs(np.asarray(op.values, np.float32)), axis=1), 6.0)


def test_swapping_a_per_row_scaled_operand_dequantizes_it():
  op, _ = quantize_operand(jax.random.normal(jax.random.key(4), (2, 8, 32)), OperandSpec(fmt=E2M1_CHANNEL), None)
  swapped = op.swap_last()  # per-row scales would lie along the new contraction axis
  assert swapped.values.dtype == jnp.float32 and jnp.ndim(swapped.scale) == 0
  np.testing.assert_array_equal(swapped.dequantize(), jnp.swapaxes(op.dequantize(), -1, -2))


_SLOW = pytest.mark.slow  # slow tier; default representative: [spec0] (NVFP4 SR: codes, scales and the key's bits)


@pytest.mark.parametrize(
  "spec",
  [
    OperandSpec(fmt=NVFP4, rounding="sr"),
    pytest.param(OperandSpec(fmt=NVFP4, rounding="eden"), marks=_SLOW),
    pytest.param(OperandSpec(fmt=NVFP4, block_shape=(16, 16)), marks=_SLOW),
    pytest.param(OperandSpec(fmt=dataclasses.replace(NVFP4, scale_mode="four_over_six")), marks=_SLOW),
    pytest.param(OperandSpec(fmt=dataclasses.replace(MXFP4, scale_mode="floor_headroom"), rounding="sr"), marks=_SLOW),
  ],
)
def test_block_operand_is_quantize_unpacked(spec):
  """The GEMM operand holds exactly quantize()'s codes and scales: values = value(q)·dec_b, scale = tensor scale."""
  x = jax.random.normal(jax.random.key(4), (48, 80), jnp.bfloat16)  # 80: a partial MXFP4 block
  key = jax.random.key(5)
  op, _ = jax.jit(lambda x, k: quantize_operand(x, spec, k))(x, key)
  q = quantize(x, spec.fmt, rounding=spec.rounding, key=key, block_shape=spec.block_shape, hadamard=0)
  unit = dataclasses.replace(q, global_scale=jnp.float32(1.0)).dequantize(jnp.float32)
  assert op.values.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(op.values, np.float32), unit)
  assert float(op.scale) == float(q.global_scale)


@pytest.mark.parametrize("radix_bits", [0, 3])
def test_select_ranks_refuses_a_digit_width_that_does_not_divide_the_keys(radix_bits):
  with pytest.raises(ValueError, match=f"radix_bits={radix_bits} must divide the 16-bit keys of bfloat16"):
    estimators.select_ranks(jnp.zeros((2, 8), jnp.bfloat16), (1,), radix_bits=radix_bits)
