"""NVFP4, MXFP4 and four-over-six at the bottom of the float32 range, against NumPy oracles (IEEE fp32 with
subnormals, ``tests/numpy_reference.py``).

XLA on CPU flushes float32 subnormals (operands and results) to zero, XLA on GPU does not. Before the fixes, on the
CPU: NVFP4 tensors with amax below 2688·2^-126 lost their subnormal ``s_dec`` and dequantized to zero, MXFP4 blocks of
subnormals quantized to zero codes, and each backend gave its own bits.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from tests import numpy_reference as ref
from tests import oracles

MX_MODES = ("floor", "rceil", "quest", "quest_nearest", "floor_headroom")


def _bits(a):
  return np.asarray(a, np.float32).view(np.uint32)


def _assert_same_floats(got, expect, what):
  got, expect = np.asarray(got, np.float32), np.asarray(expect, np.float32)
  np.testing.assert_array_equal(np.isnan(got), np.isnan(expect), err_msg=what)
  ok = ~np.isnan(expect)
  np.testing.assert_array_equal(_bits(got[ok]), _bits(expect[ok]), err_msg=what)


def test_numpy_keeps_subnormals():
  """The oracles rely on NumPy's IEEE arithmetic with gradual underflow in this process."""
  assert np.float32(2.0**-126) * np.float32(0.5) == np.float32(2.0**-127) > 0


@pytest.mark.parametrize("amax", [1e-30, 2e-34, 3.3e-35, 3.1e-35, 1e-35, 7e-36, 1e-37, 1e-38, 3e-40, 1e-42])
def test_nvfp4_tiny_tensors_match_te_bit_for_bit(amax):
  """Codes, E4M3 block scales, the stored tensor decode scale (TE's subnormal s_dec) and dequantized values."""
  rng = np.random.RandomState(int(-np.log10(amax) * 10))
  x = rng.standard_t(3, (8, 64))
  x = (x / np.abs(x).max() * amax).astype(np.float32)
  x[0, :16] *= np.float32(2.0**-20)  # a block far below the tensor amax
  codes, dec, s_dec, deq = ref.nvfp4_reference(x)
  q = jax.jit(lambda a: fp4jax.quantize(a, fp4jax.NVFP4))(x)
  np.testing.assert_array_equal(np.asarray(q.unpacked_codes()), codes)
  _assert_same_floats(q.scale_values(), dec, "block scales")
  _assert_same_floats(q.global_scale, s_dec, "tensor decode scale")
  _assert_same_floats(q.dequantize(jnp.float32), deq, "dequantize")
  _assert_same_floats(fp4jax.fake_quantize(x, fp4jax.NVFP4), deq, "fake_quantize")
  # below amax ~ 2688 / FLT_MAX / 2^20 TE's own enc_b clamps at FLT_MAX and the whole tensor dequantizes to 0
  assert np.count_nonzero(deq) > 0 or amax < 1e-38


def _mx_cases():
  """Every mode with RTN; SR under "floor" by default (the SR bits are the same oracle for every mode)."""
  slow = pytest.mark.slow  # slow tier; default representative: every mode's RTN case and [floor-sr]
  return [
    (m, r) if r == "rtn" or m == "floor" else pytest.param(m, r, marks=slow) for m in MX_MODES for r in ("rtn", "sr")
  ]


@pytest.mark.parametrize("mode, rounding", _mx_cases())
def test_mxfp4_bottom_of_the_range_matches_ocp_reference(mode, rounding):
  """Blocks with amax 2^-100 .. 2^-149 (subnormal scales and elements), blocks of subnormal inputs, normal blocks."""
  rng = np.random.RandomState(1)
  rows = np.concatenate([-np.arange(100, 150, 2), [0, 20, -20]]).astype(np.float64)
  x = rng.standard_t(3, (rows.size, 128)) * np.exp2(rows)[:, None]
  x[:, 64:96] = rng.randint(-(1 << 23), 1 << 23, (rows.size, 32)) * 2.0**-149  # subnormal inputs
  x[-1, 96:] = rng.randint(-8, 8, 32) * 2.0**-149  # a few ulps of the smallest subnormal
  x = x.astype(np.float32)
  fmt = dataclasses.replace(fp4jax.MXFP4, scale_mode=mode)
  key = jax.random.key(11) if rounding == "sr" else None
  bits = None
  if rounding == "sr":
    bits = np.asarray(fp4jax.bits.random_bits(jax.random.split(key, 3)[1], x.shape))
  codes, exps, deq = ref.mxfp4_reference(x, mode, rounding, bits)
  q = jax.jit(lambda a, k: fp4jax.quantize(a, fmt, rounding=rounding, key=k))(x, key)
  np.testing.assert_array_equal(np.asarray(q.scales).view(np.uint8).astype(np.int64) - 127, exps)
  np.testing.assert_array_equal(np.asarray(q.unpacked_codes()), codes)
  _assert_same_floats(q.dequantize(jnp.float32), deq, "dequantize")
  _assert_same_floats(fp4jax.fake_quantize(x, fmt, rounding=rounding, key=key), deq, "fake_quantize")
  if not mode.startswith("quest"):  # QuEST's scale target has a floor of 1e-8: tiny blocks round to 0 there
    assert np.count_nonzero(codes[:-3] & 7) > 0.3 * codes[:-3].size  # the tiny blocks do not all round to 0


FOUR_OVER_SIX = dataclasses.replace(fp4jax.NVFP4, scale_mode="four_over_six")


@pytest.mark.parametrize(  # slow tier; default representative: [float32] (bfloat16 values, cast, are float32 inputs)
  "dtype", [np.float32, pytest.param(jnp.bfloat16, marks=pytest.mark.slow)]
)
def test_four_over_six_selection_matches_oracle(dtype):
  """Heavy-tailed rows over eight decades, and ten decades down to subnormal tensors, along both axes."""
  rng = np.random.RandomState(2)
  x = rng.standard_t(3, (64, 256)) * np.logspace(-4, 4, 64)[:, None]
  x = np.asarray(np.asarray(x, np.float32).astype(dtype), np.float32)
  for a in (x, x * np.float32(1e-36), x.T.copy()):
    codes, dec, s_dec, deq, use4 = ref.nvfp4_four_over_six_reference(a)
    q = jax.jit(lambda v: fp4jax.quantize(v, FOUR_OVER_SIX))(a)
    np.testing.assert_array_equal(np.asarray(q.unpacked_codes()), codes)
    _assert_same_floats(q.scale_values(), dec, "block scales")
    _assert_same_floats(q.global_scale, s_dec, "tensor decode scale")
    _assert_same_floats(q.dequantize(jnp.float32), deq, "dequantize")
    assert 0 < use4.mean() < 1


def test_four_over_six_of_a_tiny_tensor_matches_oracle():
  """A tensor of amax ~1e-35 whose elements and block errors are partly fp32 subnormals: each candidate's error is
  taken on values scaled by 2^-floor(log2 amax_b) first, so no backend flushes it (XLA:CPU flushed the unscaled
  difference, and 2021 codes of such a 128x256 tensor differed from the IEEE oracle and from a GPU). 64x256, the
  shape of ``test_four_over_six_selection_matches_oracle``, whose quantizer program it reuses."""
  a = (np.random.RandomState(0).standard_t(3, (64, 256)) * 1e-37).astype(np.float32)
  codes, dec, s_dec, deq, _ = ref.nvfp4_four_over_six_reference(a)
  q = jax.jit(lambda v: fp4jax.quantize(v, FOUR_OVER_SIX))(a)
  np.testing.assert_array_equal(np.asarray(q.unpacked_codes()), codes)
  _assert_same_floats(q.scale_values(), dec, "block scales")
  _assert_same_floats(q.dequantize(jnp.float32), deq, "dequantize")


def test_four_over_six_of_blocks_with_subnormal_amax_matches_oracle():
  """Blocks whose amax is subnormal are scaled by 2^127 rather than 2^-floor(log2 amax_b) for their errors (a float32
  factor); the oracle scales by 2^-floor(log2 amax_b) in float64. The choices, codes and values agree, with both
  candidates chosen among these blocks."""
  a = oracles.subnormal_blocks_tensor()
  codes, dec, _, deq, use4 = ref.nvfp4_four_over_six_reference(a)
  subnormal = np.abs(a.reshape(64, -1, 16)).max(-1) < np.float32(2.0**-126)
  assert subnormal.mean() > 0.9 and 0 < use4[subnormal].mean() < 1
  q = jax.jit(lambda v: fp4jax.quantize(v, FOUR_OVER_SIX))(a)
  np.testing.assert_array_equal(np.asarray(q.unpacked_codes()), codes)
  _assert_same_floats(q.scale_values(), dec, "block scales")
  _assert_same_floats(q.dequantize(jnp.float32), deq, "dequantize")


# slow tier; default representative: test_oracles_numerics::test_four_over_six_picks_each_candidate_and_keeps_6_on_ties
@pytest.mark.slow
def test_four_over_six_ties_keep_six():
  """Hand-built blocks (tensor amax A; s_enc = 1536 / A, so a block with amax A has exact scales 256 (t = 6) and
  384 (t = 4)): [A, A/2] is exact under both (tie -> 6), [A, A/3] only under 6 (-> 6), [A, 3A/8] only under 4
  (-> 4)."""
  a = np.float32(3.0)
  x = np.zeros((3, 16), np.float32)
  x[:, 0] = a
  x[:, 1] = [a / 2, a / 3, a * 3 / 8]
  q = fp4jax.quantize(x, FOUR_OVER_SIX)
  np.testing.assert_array_equal(np.asarray(q.scale_values())[:, 0], [256.0, 256.0, 384.0])
  np.testing.assert_array_equal(np.asarray(ref.nvfp4_four_over_six_reference(x)[4])[:, 0], [False, False, True])
