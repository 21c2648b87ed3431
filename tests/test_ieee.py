"""Correctly rounded float32 division (``fp4jax.ieee.div_rn``) against float64 NumPy rounded once to float32."""

import jax
import jax.numpy as jnp
import numpy as np

from fp4jax.ieee import div_rn


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
  """The backend's division may be up to 2 ulp off (div.full.f32 on GPU): every such guess gives the exact result."""
  from fp4jax.ieee import rounded_significand_quotient

  rng = np.random.RandomState(1)
  ma = rng.randint(1 << 23, 1 << 24, 5000).astype(np.uint64)
  mb = rng.randint(1 << 23, 1 << 24, 5000).astype(np.uint64)
  n = np.where(ma < mb, ma << 24, ma << 23)
  floor_q, rem = n // mb, n % mb
  up = (2 * rem > mb) | ((2 * rem == mb) & (floor_q % 2 == 1))
  expect = floor_q + up
  carry = expect >> 24
  expect = np.where(carry == 1, expect >> 1, expect)
  for off in (-2, -1, 0, 1, 2):
    q, c = rounded_significand_quotient(jnp.asarray(ma, jnp.uint32), jnp.asarray(mb, jnp.uint32),
                                        jnp.asarray(floor_q.astype(np.int64) + off, jnp.uint32))
    np.testing.assert_array_equal(np.asarray(q), expect.astype(np.uint32))
    np.testing.assert_array_equal(np.asarray(c), carry.astype(np.int32))
