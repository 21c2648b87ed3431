"""Exhaustive and boundary tests of the E2M1, E4M3, E8M0 and BF16 roundings against ml_dtypes."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fp4jax._src import bits, formats, rounding
from tests import numpy_reference as ref

GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)


def _around(points):
  """Each point and its float32 neighbours, both signs; float32 subnormals are left out (XLA flushes them)."""
  p = np.asarray(points, np.float32)
  near = np.concatenate([p, np.nextafter(p, np.float32(np.inf)), np.nextafter(p, np.float32(-np.inf))])
  near = near[(near == 0) | (np.abs(near) >= np.finfo(np.float32).tiny)]
  return np.concatenate([near, -near]).astype(np.float32)


def test_e2m1_decode_every_code():
  codes = np.arange(16, dtype=np.uint8)
  expect = np.concatenate([GRID, -GRID])
  np.testing.assert_array_equal(np.asarray(formats.e2m1_decode(jnp.asarray(codes))), expect)


def test_rtn_e2m1_fixes_every_grid_value():
  v = np.concatenate([GRID, -GRID[1:]])
  codes = rounding.rtn_e2m1(jnp.asarray(v))
  np.testing.assert_array_equal(np.asarray(formats.e2m1_decode(codes)), v)


def test_rtn_e2m1_boundaries_match_ml_dtypes():
  midpoints = (GRID[1:] + GRID[:-1]) / 2
  x = _around(np.concatenate([GRID, midpoints, [5.0, 6.5, 100.0]]))
  x = np.clip(x, -6, 6)
  got = np.asarray(rounding.rtn_e2m1(jnp.asarray(x)))
  np.testing.assert_array_equal(got, ref.e2m1_codes(x))


def test_rtn_e2m1_every_bfloat16_matches_ml_dtypes():
  """All 65536 bfloat16 bit patterns (finite ones, clipped to ±6) against ml_dtypes' float4_e2m1fn rounding."""
  x = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
  x = np.clip(x[np.isfinite(x)], -6, 6)
  np.testing.assert_array_equal(np.asarray(rounding.rtn_e2m1(jnp.asarray(x))), ref.e2m1_codes(x))


def test_sr_e2m1_threshold_is_exact_in_both_ranges():
  """Up iff u < (|x| - lo)/gap: 22-bit u = bits >> 10 for |x| >= 1, 24-bit u = bits >> 8 below."""
  x = jnp.array([2.5, 2.5, 0.375, 0.375], jnp.float32)  # fractions 1/2 and 3/4 of their gaps
  b = jnp.array([(2**21 - 1) << 10, 2**21 << 10, (3 * 2**22 - 1) << 8, (3 * 2**22) << 8], jnp.uint32)
  np.testing.assert_array_equal(np.asarray(formats.e2m1_decode(rounding.sr_e2m1(x, b))), [3.0, 2.0, 0.5, 0.0])


@pytest.mark.parametrize(
  "x,code", [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6), (-5.0, 14)]
)
def test_rtn_e2m1_ties_go_to_even_code(x, code):
  assert int(rounding.rtn_e2m1(jnp.float32(x))) == code


def test_rtn_e2m1_sign_bit_and_saturation():
  x = jnp.array([-0.0, 0.0, -0.1, 7.0, -1e30, jnp.inf, -jnp.inf], jnp.float32)
  np.testing.assert_array_equal(np.asarray(rounding.rtn_e2m1(x)), [0, 0, 8, 7, 15, 7, 15])


def test_sr_e2m1_deterministic_cases():
  x = jnp.asarray(np.concatenate([GRID, -GRID]))  # grid points never move
  b = bits.random_bits(jax.random.key(0), x.shape)
  np.testing.assert_array_equal(np.asarray(formats.e2m1_decode(rounding.sr_e2m1(x, b))), np.asarray(x))
  # up iff u·gap < |x| - lo: u = 0 rounds any off-grid value up, u = 1 - 2^-24 rounds 2.5 down
  x = jnp.full((4,), 2.5, jnp.float32)
  up = rounding.sr_e2m1(x, jnp.zeros((4,), jnp.uint32))
  down = rounding.sr_e2m1(x, jnp.full((4,), 0xFFFFFFFF, jnp.uint32))
  np.testing.assert_array_equal(np.asarray(formats.e2m1_decode(up)), 3.0)
  np.testing.assert_array_equal(np.asarray(formats.e2m1_decode(down)), 2.0)


def test_sr_e2m1_is_unbiased_chi_square():
  """Mean of N stochastic roundings vs x: sum of z² over elements ~ chi²(n) with the exact Bernoulli variance."""
  rng = np.random.RandomState(0)
  x = np.concatenate([rng.uniform(-6, 6, 200), [0.3, -0.3, 5.9, -4.1]]).astype(np.float32)
  n_keys = 4000
  keys = jax.random.split(jax.random.key(1), n_keys)
  q = jax.vmap(lambda k: formats.e2m1_decode(rounding.sr_e2m1(jnp.asarray(x), bits.random_bits(k, x.shape))))(keys)
  mean = np.asarray(q, np.float64).mean(0)
  a = np.abs(x.astype(np.float64))
  lo = GRID[np.searchsorted(GRID, a, side="right") - 1].astype(np.float64)
  hi = GRID[np.minimum(np.searchsorted(GRID, a, side="right"), 7)].astype(np.float64)
  var = (a - lo) * (hi - a)
  ok = var > 0
  chi2 = np.sum((mean[ok] - x[ok]) ** 2 / (var[ok] / n_keys))
  dof = ok.sum()
  assert abs(chi2 - dof) < 5 * np.sqrt(2 * dof), (chi2, dof)


def test_rtn_e4m3_every_finite_value_and_midpoints():
  allv = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
  finite = np.unique(allv[np.isfinite(allv)])
  np.testing.assert_array_equal(np.asarray(rounding.rtn_e4m3(jnp.asarray(finite))), finite)
  pos = finite[finite >= 0]
  mids = ((pos[1:].astype(np.float64) + pos[:-1]) / 2).astype(np.float32)
  x = _around(np.concatenate([mids, [448.0, 464.0, 500.0]]))
  expect = ref.e4m3(np.clip(x, -448, 448))
  np.testing.assert_array_equal(np.asarray(rounding.rtn_e4m3(jnp.asarray(x))), expect)


def test_rtn_e4m3_random_values_match_ml_dtypes():
  rng = np.random.RandomState(1)
  x = (rng.randn(20000) * np.exp2(rng.uniform(-14, 10, 20000))).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(rounding.rtn_e4m3(jnp.asarray(x))), ref.e4m3(np.clip(x, -448, 448)))


def test_rtn_e4m3_every_bf16_value():
  """Every bf16 bit pattern (float32 subnormals included): ml_dtypes' RNE cast of the value clipped to ±448."""
  x = np.arange(2**16, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
  got = np.asarray(rounding.rtn_e4m3(jnp.asarray(x)))
  expect = ref.e4m3(np.clip(x, -448, 448))
  np.testing.assert_array_equal(got, expect)  # NaN == NaN here; the sign of zero is compared too
  np.testing.assert_array_equal(np.signbit(got), np.signbit(expect))


def test_rtn_e4m3_keeps_nan():
  assert np.isnan(np.asarray(rounding.rtn_e4m3(jnp.float32(np.nan))))


def test_sr_e4m3_lands_on_neighbours_and_is_unbiased():
  rng = np.random.RandomState(2)
  x = np.exp2(rng.uniform(-10, 8, 64)).astype(np.float32)
  n = 4000
  keys = jax.random.split(jax.random.key(3), n)
  q = np.asarray(jax.vmap(lambda k: rounding.sr_e4m3(jnp.asarray(x), bits.random_bits(k, x.shape)))(keys), np.float64)
  step = np.exp2(np.maximum(np.floor(np.log2(x.astype(np.float64))), -6) - 3)
  lo = np.floor(x / step) * step
  assert np.all((q == lo) | (q == lo + step))
  var = (x - lo) * (lo + step - x)
  ok = var > 0
  chi2 = np.sum((q.mean(0)[ok] - x[ok]) ** 2 / (var[ok] / n))
  assert abs(chi2 - ok.sum()) < 5 * np.sqrt(2 * ok.sum())


def test_e8m0_decodes_every_pattern():
  b = np.arange(256, dtype=np.uint8)
  vals = np.asarray(formats.MXFP4.decode_scales(jnp.asarray(b.view(ml_dtypes.float8_e8m0fnu))))
  np.testing.assert_array_equal(vals[:255], np.exp2(np.arange(255, dtype=np.float64) - 127).astype(np.float32))
  assert np.isnan(vals[255])


def test_rtn_bf16_matches_ml_dtypes():
  rng = np.random.RandomState(4)
  x = (rng.randn(20000) * np.exp2(rng.uniform(-100, 100, 20000))).astype(np.float32)
  b = x.astype(ml_dtypes.bfloat16).astype(np.float32)
  mids = (b.astype(np.float64) + np.nextafter(b, np.float32(np.inf)).astype(ml_dtypes.bfloat16).astype(np.float64)) / 2
  xs = np.concatenate([x, mids.astype(np.float32), [np.inf, -np.inf, 3.3895314e38]]).astype(np.float32)
  np.testing.assert_array_equal(
    np.asarray(rounding.rtn_bf16(jnp.asarray(xs))), xs.astype(ml_dtypes.bfloat16).astype(np.float32)
  )
  assert np.isnan(np.asarray(rounding.rtn_bf16(jnp.float32(np.nan))))


def test_floor_log2_and_pow2_are_exact():
  e = np.arange(-149, 128)
  p = np.asarray(formats.pow2(jnp.asarray(e)))
  np.testing.assert_array_equal(p, np.exp2(e.astype(np.float64)).astype(np.float32))
  np.testing.assert_array_equal(np.asarray(formats.floor_log2(jnp.asarray(p))), e)
  x = np.nextafter(p, np.float32(0))
  np.testing.assert_array_equal(np.asarray(formats.floor_log2(jnp.asarray(x)))[1:], e[1:] - 1)
