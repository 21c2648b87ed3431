"""The sign bit of a zero E2M1 code (0x0 or 0x8) is the same on every backend: an exact rule, checked against a
float64 oracle.

Rule (NVFP4 and MXFP4, RTN and SR): the code of ``x`` is negative iff its scaled value ``v = x · s`` (``s`` = NVFP4's
``enc_b``, MXFP4's ``2^-e_b``), rounded once to float32 with gradual underflow (IEEE), is below zero: ``x < 0`` and
the exact ``|x| · s > 2^-150`` (half the smallest subnormal; exactly 2^-150 is a tie and rounds to the even 0).
``x = -0.0`` and products that round to -0 give code 0x0, as TE's reference ``cast_to_fp4x2`` (``v < -0.0``).

Before the fix, XLA on the CPU flushed a negative subnormal NVFP4 product to -0 (code 0x0) while a GPU (XLA or the
Pallas kernels' ``mul.rn.f32``) kept it (code 0x8): both dequantize to zero, but the packed bits differed by device.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax._src.formats import E2M1_CHANNEL
from fp4jax._src.operand import quantize_operand
from fp4jax._src.recipes import OperandSpec
from tests import numpy_reference as ref
from tests import oracles

F32 = np.float32
HALF_SMALLEST_SUBNORMAL, SMALLEST_NORMAL = oracles.HALF_SMALLEST_SUBNORMAL, oracles.SMALLEST_NORMAL


def _tie_block() -> np.ndarray:
  """Two 16-element blocks with exactly known scales: the tensor amax 2688·2^100 (s_enc = 2^-100, s_dec = 2^100)
  and a block of amax 1536·2^100 (dec_b = 256, enc_b = 2^-108): ``-2^-42`` times it is exactly -2^-150, the tie."""
  t = 2.0**-42
  first = [2688.0 * 2.0**100] + [0.0] * 15
  second = [1536.0 * 2.0**100]
  second += [-t, -t * (1 + 2.0**-23), -t * (1 - 2.0**-24), -2 * t, -t / 2, -1.5 * t, -(2.0**-20), -(2.0**-10)]
  second += [-0.0, t * (1 + 2.0**-23), -(2.0**-40), -(2.0**-30), -(2.0**-25), -(2.0**-22), -(2.0**-18)]
  return np.array([first + second], F32)


def _nvfp4_input() -> np.ndarray:
  """Rows of 16-element blocks, each with one element 1e30 (so enc_b = f32(1/(448·s_dec)), about 6e-30 = 2^-97)
  and negatives of magnitude 2^-60 .. 2^-20: their products span IEEE underflow, the subnormals and the normals.
  Row 0 is the issue's block [1e30, -1e-10, -3e-9, 0, ...] (products -6e-40: subnormal; -1.8e-38: normal)."""
  rng = np.random.RandomState(30)
  x = -np.exp2(rng.uniform(-60, -20, (6, 64))) * rng.uniform(1, 2, (6, 64))
  x[:, ::16] = 1e30
  x[0, :16] = [1e30, -1e-10, -3e-9] + [0.0] * 13
  x[1, 1:5] = [-0.0, 1e-10, -(2.0**-149), -1e-45]  # -0.0, a positive, subnormal x
  return np.concatenate([x.astype(F32), np.pad(_tie_block(), ((0, 0), (0, 32)))], 0)


def _assert_coverage(x: np.ndarray, s: np.ndarray):
  """The input exercises every case of the rule: negative products that IEEE rounds to a subnormal, to a normal and
  to -0 (below, and exactly at, 2^-150), and x = -0.0."""
  p = np.abs(x.astype(np.float64) * s.astype(np.float64))
  neg = x < 0
  assert np.sum(neg & (p > HALF_SMALLEST_SUBNORMAL) & (p < SMALLEST_NORMAL)) >= 20  # subnormal
  assert np.sum(neg & (p >= SMALLEST_NORMAL)) >= 20  # normal
  assert np.sum(neg & (p < HALF_SMALLEST_SUBNORMAL)) >= 20  # underflows to -0
  assert np.sum(neg & (p == HALF_SMALLEST_SUBNORMAL)) >= 1  # the tie
  assert np.sum(np.signbit(x) & (x == 0)) >= 1  # -0.0


def _codes(q) -> np.ndarray:
  return np.asarray(q.unpacked_codes())


def test_nvfp4_rtn_zero_sign_is_the_exact_product_sign():
  """Codes and dequantized bits (a code 0x8 dequantizes to -0.0) against TE's order in NumPy, the sign bit from
  the exact float64 rule; the issue's block gives 0x8 for -1e-10 (product -6e-40, subnormal) and -3e-9."""
  x = _nvfp4_input()
  codes, dec, s_dec, deq = ref.nvfp4_reference(x)
  enc = oracles.nvfp4_enc(dec, s_dec, x.shape)
  _assert_coverage(x, enc)
  want = (codes & 7) | np.where(oracles.negative_exactly(x, enc), 8, 0).astype(np.uint8)
  np.testing.assert_array_equal(want[0, :4], [7, 8, 8, 0])
  q = jax.jit(lambda a: fp4jax.quantize(a, fp4jax.NVFP4))(x)
  np.testing.assert_array_equal(_codes(q), want)
  got_deq = np.asarray(q.dequantize(jnp.float32))
  np.testing.assert_array_equal(got_deq.view(np.uint32), deq.view(np.uint32))
  fake = np.asarray(jax.jit(lambda a: fp4jax.fake_quantize(a, fp4jax.NVFP4, dtype=jnp.float32))(x))
  np.testing.assert_array_equal(fake.view(np.uint32), deq.view(np.uint32))


def test_nvfp4_sr_zero_sign_is_the_exact_product_sign():
  """SR: the same scales as RTN (``scale_mode="absmax"``), magnitudes by the SR oracle from the element bits, the
  sign bit from the exact rule."""
  x = _nvfp4_input()
  _, dec, s_dec, _ = ref.nvfp4_reference(x)
  enc = oracles.nvfp4_enc(dec, s_dec, x.shape)
  key = jax.random.key(4)
  bits = np.asarray(fp4jax.bits.random_bits(jax.random.split(key, 3)[1], x.shape))
  v = (x.astype(np.float64) * enc).astype(F32)  # IEEE float32 product with gradual underflow
  with np.errstate(invalid="ignore"):  # the oracle's 0/0 for saturated elements, discarded by its np.where
    want = ref.e2m1_sr_codes(v, oracles.negative_exactly(x, enc), bits)
  q = jax.jit(lambda a, k: fp4jax.quantize(a, fp4jax.NVFP4, rounding="sr", key=k))(x, key)
  np.testing.assert_array_equal(_codes(q), want)


def test_nvfp4_four_over_six_zero_sign_is_the_exact_product_sign():
  """Four-over-six: each block's chosen candidate (target 6 or 4, NumPy oracle) scales by its own enc_b."""
  x = _nvfp4_input()
  codes, dec, s_dec, _, _ = ref.nvfp4_four_over_six_reference(x)
  enc = oracles.nvfp4_enc(dec, s_dec, x.shape)
  want = (codes & 7) | np.where(oracles.negative_exactly(x, enc), 8, 0).astype(np.uint8)
  fmt = dataclasses.replace(fp4jax.NVFP4, scale_mode="four_over_six")
  q = jax.jit(lambda a: fp4jax.quantize(a, fmt))(x)
  np.testing.assert_array_equal(_codes(q), want)


# slow tier; default representative: [rtn] (the sign rule under SR: test_nvfp4_sr_zero_sign_is_the_exact_product_sign)
@pytest.mark.parametrize("rounding", ["rtn", pytest.param("sr", marks=pytest.mark.slow)])
def test_mxfp4_zero_sign_is_the_exact_scaled_value_sign(rounding):
  """MXFP4 scales by 2^-e_b (exact on the bits, subnormals kept): x = -2^-149 in a block of amax 2^127 has the
  exact scaled value -2^-274, which rounds to -0: code 0x0; a scaled value that stays subnormal gives 0x8."""
  rng = np.random.RandomState(31)
  x = -np.exp2(rng.uniform(-149, -100, (4, 64))) * rng.uniform(1, 2, (4, 64))
  x[:2, ::32] = 2.0**127 * 1.5  # e_b = 125: scaled values 2^-274 .. 2^-223 underflow
  x[2, ::32] = 2.0**30  # e_b = 28: 2^-177 .. 2^-126, underflowing or subnormal
  x[3, ::32] = 2.0**-90  # e_b = -92: 2^-57 .. 2^-6, normal
  x[3, 1:3] = [-0.0, -(2.0**-149)]
  x = x.astype(F32)
  e = np.repeat(ref.mx_exponents(np.max(np.abs(x.reshape(4, 2, 32)), -1), "floor"), 32, -1).reshape(x.shape)
  s = np.exp2(-e.astype(np.float64)).astype(F32)
  negative = oracles.negative_exactly(x, s)
  scaled = np.abs(x.astype(np.float64) * s)
  assert np.sum(negative & (scaled < SMALLEST_NORMAL)) >= 10  # subnormal scaled values
  assert np.sum(negative & (scaled >= SMALLEST_NORMAL)) >= 10
  assert np.sum((x < 0) & ~negative) >= 50  # underflowing to -0
  key = jax.random.key(5) if rounding == "sr" else None
  bits = None if key is None else np.asarray(fp4jax.bits.random_bits(jax.random.split(key, 3)[1], x.shape))
  codes, _, _ = ref.mxfp4_reference(x, "floor", rounding, bits)
  want = (codes & 7) | np.where(negative, 8, 0).astype(np.uint8)
  q = jax.jit(lambda a, k: fp4jax.quantize(a, fp4jax.MXFP4, rounding=rounding, key=k))(x, key)
  np.testing.assert_array_equal(_codes(q), want)


def test_e2m1_channel_values_follow_the_ieee_product():
  """The per-row E2M1 operand (``E2M1_CHANNEL``): values rne_e2m1(f32(x·γ)) with the NumPy IEEE product, bit for
  bit (-0.0 for a negative subnormal product), also for subnormal ``x`` that a flushing CPU counted as 0."""
  x = np.array([[1e30, -1e-10, -3e-9, -1e-16, -0.0, 1e-10] + [0.0] * 10, [1e-37, 5e-39, -5e-39, -1e-45] + [0.0] * 12])
  x = x.astype(F32)
  values, _ = oracles.e2m1_channel(x)
  assert np.sum(np.signbit(values) & (values == 0)) >= 2  # negative subnormal products: -0.0
  op, _ = quantize_operand(jnp.asarray(x), OperandSpec(fmt=E2M1_CHANNEL), None)
  got = np.asarray(op.values, np.float32)
  np.testing.assert_array_equal(got.view(np.uint32), values.astype(F32).view(np.uint32))
