"""MS-EDEN and its 128-point Hadamard rotation at the bottom of the float32 range, against NumPy (IEEE float32 with
subnormals, ``tests/numpy_reference.py``, ``tests/oracles.py``).

XLA on CPU flushes float32 subnormals (operands and results) to zero, a GPU keeps them. Before the fix the rotation
was a plain float32 butterfly: on the CPU every subnormal element and partial sum was flushed, so ~16% of MS-EDEN's
codes on tiny tensors differed between CPU and GPU (``tests/test_gpu_parity.py``).
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp4jax
from fp4jax._src import bits as bits_lib
from fp4jax._src import hadamard as H
from tests import numpy_reference as ref
from tests import oracles

F32 = np.float32


def _bits(a):
  return np.asarray(a, F32).view(np.uint32)


def _assert_same_floats(got, expect, what):
  got, expect = np.asarray(got, F32), np.asarray(expect, F32)
  np.testing.assert_array_equal(np.isnan(got), np.isnan(expect), err_msg=what)
  ok = ~np.isnan(expect)
  np.testing.assert_array_equal(_bits(got[ok]), _bits(expect[ok]), err_msg=what)


def _tiny(rng, shape, lo=-140, hi=-127):
  """Elements ±m·2^e, m uniform in [1, 2), e in [lo, hi): all subnormal for hi <= -127 (rounded to float32)."""
  x = rng.choice([-1.0, 1.0], shape) * rng.uniform(1, 2, shape) * np.exp2(rng.integers(lo, hi, shape))
  return x.astype(F32)


def _sizes_128():
  """``H.SIZES`` with all but 128 (MS-EDEN's rotation) in the slow tier: each size compiles its own programs."""
  slow = pytest.mark.slow  # slow tier; default representative: d = 128, MS-EDEN's size (see each test's decorator)
  return [d if d == 128 else pytest.param(d, marks=slow) for d in H.SIZES]


def _rotation_inputs(d, signs, inverse):
  """Rows of 2d elements: all subnormal; subnormal mixed with normal values up to 2^96 (the exactness bound) in one
  chunk; tiny rows beside normal rows; a zero row; a row with Inf and one with NaN; a subnormal chunk with two 2^90
  that cancel exactly in half the outputs (those are sums of subnormals alone)."""
  rng = np.random.default_rng(d)
  x = _tiny(rng, (12, 2 * d))
  x[1] = _tiny(rng, 2 * d, -149, 96)
  x[2] = _tiny(rng, 2 * d, -149, -120)
  x[3] = rng.standard_normal(2 * d)
  x[4] = _tiny(rng, 2 * d, -130, -110)
  x[5] = 0.0
  x[6, 3], x[7, d + 1] = np.inf, np.nan
  x[8, ::2] = -x[8, 1::2]  # pairs that cancel exactly in the first stage
  x[9, 0] = 2.0**90
  x[9, d // 2] = x[9, 0] if inverse else x[9, 0] * signs[0] * signs[d // 2]  # paired in stage 1: a - b = 0
  return x


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("d", _sizes_128())
def test_rotation_is_ieee_with_subnormals_on_every_backend(d, inverse):
  """Bits of ``hadamard`` / ``inverse_hadamard`` (under jit, with random signs) equal NumPy's float32 butterfly with
  gradual underflow, subnormal inputs, partial sums and results included; Inf/NaN chunks give Inf/NaN as IEEE."""
  signs = np.asarray(H.random_signs(jax.random.key(d), d))
  x = _rotation_inputs(d, signs, inverse)
  f = H.inverse_hadamard if inverse else H.hadamard
  got = jax.jit(lambda a, s: f(a, d, signs=s))(x, signs)
  _assert_same_floats(got, ref.hadamard_ieee(x, d, signs, inverse), f"d={d} inverse={inverse}")
  got = np.asarray(got)
  assert np.all(np.isnan(got[7, d : 2 * d])) and np.count_nonzero(got[0]) > d
  assert np.sum((got[9, :d] != 0) & (np.abs(got[9, :d]) < 2.0**-126)) >= d // 4  # the cancelled outputs


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("d", _sizes_128())
def test_the_direct_rotation_other_backends_run_is_the_same_ieee_transform(d, inverse):
  """The float32 path that backends other than the CPU run (``_direct``: a GPU keeps subnormals natively) gives the
  NumPy IEEE bits wherever this CPU's flushing cannot interfere: inputs, partial sums and results all normal (rows
  of N(0, 1) values and of values spread over 2^-60 .. 2^60, Inf and NaN included). Its agreement on subnormal
  data is the GPU parity test's (``tests/test_gpu_parity.py::test_ms_eden_gpu_matches_cpu_on_tiny_and_extreme_data``).
  """
  rng = np.random.default_rng(100 + d)
  signs = np.asarray(H.random_signs(jax.random.key(d), d))
  x = rng.standard_normal((6, 2 * d)).astype(F32)
  x[1] = (rng.choice([-1.0, 1.0], 2 * d) * np.exp2(rng.uniform(-60, 60, 2 * d))).astype(F32)
  x[2, 5], x[3, d + 2] = np.inf, np.nan
  chunks = x.reshape(6, 2, d)
  got = jax.jit(lambda a, s: H._direct(a, s, d=d, inverse=inverse))(chunks, signs).reshape(6, 2 * d)
  _assert_same_floats(got, ref.hadamard_ieee(x, d, signs, inverse), f"d={d} inverse={inverse}")


@pytest.mark.parametrize("d", _sizes_128())  # d = 128: bit for bit wherever the result is normal
def test_rotation_commutes_with_powers_of_two(d):
  """``hadamard(x) = fl(hadamard(x·2^j)·2^-j)`` for x out of the subnormal range after scaling: bit for bit where
  the normalization is a power of two (d = 16, 64, 256, one rounding either way) and wherever the result is normal."""
  rng = np.random.default_rng(100 + d)
  x = _tiny(rng, (8, 2 * d), -149, -118)
  j = 90
  small = np.asarray(H.hadamard(x, d))
  big = np.asarray(H.hadamard((x.astype(np.float64) * 2.0**j).astype(F32), d))
  back = (big.astype(np.float64) * 2.0**-j).astype(F32)
  where = np.ones(x.shape, bool) if np.log2(d) % 2 == 0 else np.abs(back) >= np.finfo(F32).tiny
  assert where.mean() > 0.5
  np.testing.assert_array_equal(_bits(small[where]), _bits(back[where]))


def _ms_eden_oracle(x, key, dtype):
  """NumPy MS-EDEN of the rotated ``x``: the IEEE rotation (bf16 inputs rounded once to bf16, RNE), then
  ``oracles.ms_eden`` with the scale bits ``fp4jax.quantize`` documents (third split of the key)."""
  signs = np.asarray(H.random_signs(jax.random.split(key, 3)[0], 128))
  r = ref.hadamard_ieee(np.asarray(x, F32), 128, signs)
  if dtype == jnp.bfloat16:
    r = r.astype(ml_dtypes.bfloat16).astype(F32)
  scale_bits = np.asarray(bits_lib.random_bits(jax.random.split(key, 3)[2], (x.shape[0], x.shape[1] // 16)))
  with np.errstate(all="ignore"):
    return oracles.ms_eden(r, scale_bits)


def _tiny_tensors():
  rng = np.random.default_rng(7)
  tiny = _tiny(rng, (16, 256))
  mixed = _tiny(rng, (16, 256), -149, -126)
  mixed[::4] = rng.standard_normal((4, 256)) * 2.0**-100  # normal rows beside tiny ones
  near = _tiny(rng, (16, 256), -130, -110)  # tiny tensor amax: TE's s_enc clamps at FLT_MAX, s_dec subnormal
  return {"tiny": tiny, "mixed": mixed, "near": near}


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
@pytest.mark.parametrize("data", ["tiny", "mixed", "near"])
def test_ms_eden_of_tiny_tensors_equals_the_numpy_oracle(data, dtype):
  """Corrected E4M3 scales, tensor decode scale and rotated-domain dequantized values (hence the codes) of jitted
  ``quantize(..., rounding="eden")`` equal the NumPy oracle with subnormals kept."""
  x = np.asarray(_tiny_tensors()[data].astype(dtype))
  key = jax.random.key(11)
  dec, s_dec, want = _ms_eden_oracle(x, key, dtype)
  q = jax.jit(lambda a, k: fp4jax.quantize(a, fp4jax.NVFP4, rounding="eden", key=k))(x, key)
  _assert_same_floats(q.scales.astype(jnp.float32), dec, "corrected block scales")
  _assert_same_floats(q.global_scale, s_dec, "tensor decode scale")
  _assert_same_floats(q.dequantize(jnp.float32, rotated=True), want, "dequantized (rotated)")
  assert np.count_nonzero(dec) > 0 and np.count_nonzero(want) > 0  # not a trivially zero quantization


def test_ms_eden_zero_and_non_finite_tensors():
  """An all-zero tensor quantizes to zeros with zero scales; a NaN or Inf element makes the result NaN, never
  finite."""
  key = jax.random.key(0)
  f = jax.jit(lambda a: fp4jax.fake_quantize(a, fp4jax.NVFP4, rounding="eden", key=key, dtype=jnp.float32))
  zero = np.zeros((4, 256), F32)
  q = fp4jax.quantize(zero, fp4jax.NVFP4, rounding="eden", key=key)
  assert not np.any(np.asarray(q.unpacked_codes())) and not np.any(np.asarray(q.scales.astype(jnp.float32)))
  assert np.all(np.asarray(f(zero)) == 0)  # ±0: the inverse rotation's negative signs make -0 (IEEE)
  for bad in (np.nan, np.inf, -np.inf):
    x = _tiny(np.random.default_rng(1), (4, 256))
    x[2, 5] = bad
    assert np.all(np.isnan(np.asarray(f(x))))
