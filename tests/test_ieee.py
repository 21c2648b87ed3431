"""Correctly rounded float32 division (``fp4jax.ieee.div_rn``) against float64 NumPy rounded once to float32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4jax._src.ieee import div_rn, mul_pow2_rn, mul_short_rn


def test_random_quotients_are_correctly_rounded():
  rng = np.random.RandomState(0)
  n = 200_000
  a = (rng.randn(n) * np.exp2(rng.uniform(-60, 60, n))).astype(np.float32)
  b = (rng.randn(n) * np.exp2(rng.uniform(-60, 60, n))).astype(np.float32)
  expect = (a.astype(np.float64) / b).astype(np.float32)
  got = np.asarray(jax.jit(div_rn)(a, b))
  normal = np.abs(expect) >= np.finfo(np.float32).tiny
  np.testing.assert_array_equal(got[normal], expect[normal])


def test_hard_cases_and_specials():
  a = np.array([3163.328613, 4.6875, 2688.0, 1.0, 1.0, 0.0, 1.0, np.inf, np.nan, 3e38], np.float32)
  b = np.array([3163.328613, 0.9375, 0.3, 3.0, 0.0, 0.0, np.inf, 2.0, 1.0, 1e-5], np.float32)
  got = np.asarray(div_rn(jnp.asarray(a), jnp.asarray(b)))
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    expect = (a.astype(np.float64) / b).astype(np.float32)
  np.testing.assert_array_equal(got, expect)
  # every float32 significand divided by itself is exactly 1
  m = np.arange(1 << 23, (1 << 23) + 4096, dtype=np.uint32) | np.uint32(0x3F800000)
  x = m.view(np.float32) * np.float32(3163.0)
  assert np.all(np.asarray(div_rn(jnp.asarray(x), jnp.asarray(x))) == 1.0)


def test_correction_recovers_from_guesses_two_off():
  """The backend's division may be up to 2 ulp off (div.full.f32 on GPU): every such guess gives the exact floor
  quotient and remainder."""
  from fp4jax._src.ieee import floor_significand_quotient

  rng = np.random.RandomState(1)
  ma = rng.randint(1 << 23, 1 << 24, 5000).astype(np.uint64)
  mb = rng.randint(1 << 23, 1 << 24, 5000).astype(np.uint64)
  n = np.where(ma < mb, ma << 24, ma << 23)
  floor_q, rem = n // mb, n % mb
  for off in (-2, -1, 0, 1, 2):
    q, r = floor_significand_quotient(jnp.asarray(ma, jnp.uint32), jnp.asarray(mb, jnp.uint32),
                                      jnp.asarray(floor_q.astype(np.int64) + off, jnp.uint32))
    np.testing.assert_array_equal(np.asarray(q), floor_q.astype(np.uint32))
    np.testing.assert_array_equal(np.asarray(r), rem.astype(np.int32))


def _f32_with_subnormals(rng, n, lo=-149, hi=127):
  return (rng.randn(n) * np.exp2(rng.uniform(lo, hi, n))).astype(np.float32)


def _same_bits(got, expect):
  """Bit-equal, except that any NaN matches any NaN."""
  got, expect = np.asarray(got, np.float32), np.asarray(expect, np.float32)
  np.testing.assert_array_equal(np.isnan(got), np.isnan(expect))
  ok = ~np.isnan(expect)
  np.testing.assert_array_equal(got[ok].view(np.uint32), expect[ok].view(np.uint32))


def test_division_with_subnormal_operands_and_quotients_is_ieee():
  """NumPy divides in float64 and rounds once to float32 with gradual underflow (no flushing): XLA's CPU flushes,
  so before the fix 1/2^127 was 0 and 1/subnormal NaN or Inf where IEEE gives a finite or subnormal result."""
  rng = np.random.RandomState(2)
  a, b = _f32_with_subnormals(rng, 100_000), _f32_with_subnormals(rng, 100_000)
  a[::7], b[::11], a[::13], b[::17], a[::19] = 0, 0, np.inf, -np.inf, np.nan
  with np.errstate(all="ignore"):
    expect = (a.astype(np.float64) / b).astype(np.float32)
  _same_bits(jax.jit(div_rn)(a, b), expect)
  # s_dec = 1 / s_enc of TE's NVFP4 tensor scale at the bottom of the range: subnormal, correctly rounded
  s_enc = np.array([2.0**127, 3e38, np.finfo(np.float32).max, 2688 / 1e-36], np.float32)
  _same_bits(div_rn(jnp.float32(1.0), jnp.asarray(s_enc)), (1.0 / s_enc.astype(np.float64)).astype(np.float32))


@pytest.mark.parametrize("num", [1, 3])
def test_mul_pow2_rn_is_ieee_with_subnormals(num):
  rng = np.random.RandomState(3)
  x = _f32_with_subnormals(rng, 100_000)
  x[::23], x[::29] = 0.0, np.inf
  k = rng.randint(-160, 160, x.size).astype(np.int32)
  with np.errstate(all="ignore"):
    expect = (x.astype(np.float64) * num * np.exp2(k.astype(np.float64))).astype(np.float32)
  _same_bits(jax.jit(lambda a, e: mul_pow2_rn(a, e, num))(x, k), expect)


def test_mul_short_rn_is_ieee_with_subnormals():
  rng = np.random.RandomState(4)
  n = 100_000
  a = (rng.randint(-127, 128, n) * np.exp2(rng.randint(-160, 100, n).astype(np.float64))).astype(np.float32)
  b = _f32_with_subnormals(rng, n)
  a[::13], b[::7], b[::31] = np.inf, 0.0, np.nan
  with np.errstate(all="ignore"):
    expect = (a.astype(np.float64) * b).astype(np.float32)
  _same_bits(jax.jit(mul_short_rn)(a, b), expect)
