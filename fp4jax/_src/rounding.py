"""Rounding onto the E2M1, E4M3 and BF16 grids by explicit arithmetic (comparisons, ``floor``/``round`` of exactly
scaled values, integer operations on the float32 bits), never by a dtype conversion (XLA on GPU deletes convert
pairs under ``jit``): the results are identical on CPU and GPU.

Rules (OCP MX v1.0; NVIDIA PTX ``cvt.rn.satfinite`` / ``cvt.rs``):
* RTN, E2M1: nearest grid value, ties to the even code; decision points on magnitudes
  [0, .25] -> 0, (.25, .75) -> .5, [.75, 1.25] -> 1, (1.25, 1.75) -> 1.5, [1.75, 2.5] -> 2, (2.5, 3.5) -> 3,
  [3.5, 5] -> 4, > 5 -> 6; saturating at 6 (Inf and NaN too). The sign bit is set for ``x < 0`` (so -0.0 -> code 0,
  -0.1 -> code 8, a negative subnormal -> code 8), as in Transformer Engine's reference ``cast_to_fp4x2``
  (``v < -0.0``), decided on the bits of ``x``.
* The sign of a zero code: the quantizers round the scaled value ``v = fl(x · s)`` (NVFP4 ``s = enc_b``, MXFP4
  ``s = 2^-e_b``), the IEEE float32 product rounded once with gradual underflow on every backend
  (``fp4jax.ieee.mul_unflushed``, ``mul_pow2_rn``). So a code is negative iff ``x < 0`` and the exact
  ``|x| · s > 2^-150`` (``|x| · s = 2^-150`` is a tie and rounds to the even -0): a negative ``x`` whose ``v`` is
  subnormal gets 0x8, one whose ``v`` underflows to -0 gets 0x0, on the CPU (whose XLA flushes subnormal products)
  as on the GPU.
* SR, E2M1: with ``lo <= |x| < hi`` the neighbouring grid values, round up with probability ``(|x| - lo)/(hi - lo)``,
  up iff a uniform ``u`` (22 bits for |x| >= 1, where the fraction has 22 bits; 24 below) is smaller than it,
  compared exactly. Unbiased inside [-6, 6].
* E4M3 (``float8_e4m3fn``): 3 mantissa bits, exponents -6..8, subnormal step 2^-9, max 448; RTN ties to even,
  saturating; SR with 20 random bits, unbiased below 448. Both scale by the grid spacing (a power of two read from
  the exponent field: exact, no division) and round to an integer.
"""

from __future__ import annotations

import jax.lax as lax
import jax.numpy as jnp
import numpy as np

from fp4jax._src.elements import E2M1_SIGN_BIT, E4M3_MAX, e4m3_step_exponent, pow2

# int32 constants, explicitly typed: under jax_enable_x64 a Python int next to another becomes int64 (jnp.where),
# and int32-int64 bit operations crash XLA's CPU compiler.
_MAGNITUDE = np.int32(0x7FFFFFFF)  # float32 bits without the sign
_SIX = np.int32(0x40C00000)  # bits of 6.0
_ONE = np.int32(0x3F800000)  # bits of 1.0
_HALF = np.int32(0x3F000000)  # bits of 0.5
_SMALLEST_NORMAL = np.int32(0x800000)  # bits of 2^-126
_MAGIC_1_5_2P22 = 0x4AC00000  # bits of 1.5 · 2^22, whose ulp is 0.5: E2M1's step below 2


def _saturated_magnitude(x: jnp.ndarray) -> jnp.ndarray:
  """int32 bits of min(|x|, 6) for float32 ``x`` (an integer min: Inf and NaN saturate to 6 on every backend)."""
  return jnp.minimum(lax.bitcast_convert_type(x, jnp.int32) & _MAGNITUDE, _SIX)


def _with_sign(mag_code: jnp.ndarray, x: jnp.ndarray) -> jnp.ndarray:
  """Sets the sign bit for ``x < 0`` (-0.0 and NaN excluded), as an integer compare on the bits, so no backend's
  denormal flushing or NaN sign changes it: ``bits(x) - 1`` (wrapping) is below ``bits(-Inf)`` exactly then."""
  negative = lax.bitcast_convert_type(x, jnp.int32) - jnp.int32(1) < -_SMALLEST_NORMAL
  return (mag_code | jnp.where(negative, jnp.int32(E2M1_SIGN_BIT), jnp.int32(0))).astype(jnp.uint8)


def rtn_e2m1(x: jnp.ndarray) -> jnp.ndarray:
  """E2M1 codes (uint8 0..15) of float32 ``x`` by round-to-nearest, ties to even, saturating at ±6 (NaN -> ±6).

  With ``a = min(|x|, 6)`` and ``e = max(exponent(a), 0)``, E2M1's step at ``a`` is ``2^(e-1)``, the ulp of
  ``M = 1.5·2^(22+e)``: the float addition ``a + M`` rounds ``a`` to the grid, to nearest with ties to even, and
  its low bits count the steps, ``k = bits(a + M) - bits(M)``, and the code is ``k + 2e``.
  The addition uses ``M + 2 ulp`` (same parity, so the same ties) and the code is taken modulo 8 as
  ``(bits(a + M + 2 ulp) + 2·(e + 127)) & 7``: ``bits(M)`` has zero low bits. About 10 integer / float operations
  per element, with no branch between binades.

  Args:
    x: float array, any shape (cast to float32).

  Returns:
    uint8 array of ``x``'s shape: E2M1 codes, bit 3 the sign (set for ``x < 0``), bits 0-2 the magnitude.
  """
  x = x.astype(jnp.float32)
  b = _saturated_magnitude(x)
  biased = jnp.maximum(b >> 23, jnp.int32(127))  # e + 127
  magic = lax.bitcast_convert_type((biased << 23) + jnp.int32(_MAGIC_1_5_2P22 - (127 << 23) + 2), jnp.float32)
  steps = lax.bitcast_convert_type(lax.bitcast_convert_type(b, jnp.float32) + magic, jnp.int32)
  return _with_sign((steps + jnp.int32(2) * biased) & jnp.int32(7), x)


def sr_e2m1(x: jnp.ndarray, bits: jnp.ndarray) -> jnp.ndarray:
  """E2M1 codes of float32 ``x`` by stochastic rounding with uint32 ``bits`` (same shape); saturates at ±6.

  With ``lo <= a = min(|x|, 6) < hi`` the neighbouring grid values, rounds up iff ``u < (a - lo)/(hi - lo)``:
  for ``a >= 1`` that fraction is the 22 mantissa bits of ``a`` below E2M1's, compared with ``u = bits >> 10``
  (22 bits) as ``(b - u + 0x3FFFFF - bits(0.5)) >> 22`` (a carry into bit 22 iff ``u`` is smaller); for ``a < 1``,
  ``u = (bits >> 8)·2^-24`` and up iff ``u·0.5 < a - lo`` (exact; for ``a < 0.5`` an integer compare of the float
  bits). ``E[value(q)] = x`` exactly for ``2^-126 <= |x| <= 6``. Both ranges decide as
  ``(bits >> 8)·2^-24 < (a - lo)/(hi - lo)`` would: same bits, same codes. Subnormal ``|x| < 2^-126`` rounds to ±0
  on every backend (XLA on CPU flushes them and XLA on GPU does not: the rule is fixed here, a bias below 2^-126).

  Args:
    x: float array, any shape (cast to float32).
    bits: uint32 random bits of ``x``'s shape (``fp4jax.bits.random_bits``).

  Returns:
    uint8 array of ``x``'s shape: E2M1 codes, bit 3 the sign (set for ``x < 0``), bits 0-2 the magnitude.
  """
  x = x.astype(jnp.float32)
  bits = bits.astype(jnp.uint32)
  b = _saturated_magnitude(x)
  normal = (b - (bits >> 10).astype(jnp.int32) + (jnp.int32(0x3FFFFF) - _HALF)) >> 22
  a = lax.bitcast_convert_type(b, jnp.float32)
  upper_half = b >= _HALF
  u_gap = (bits >> 8).astype(jnp.int32).astype(jnp.float32) * jnp.float32(2.0**-25)  # u · 0.5, exact
  # below 0.5: lo = 0 and the float order of non-negative floats is the integer order of their bits
  lower_up = lax.bitcast_convert_type(u_gap, jnp.int32) < jnp.where(b < _SMALLEST_NORMAL, jnp.int32(0), b)
  up = jnp.where(upper_half, u_gap < a - jnp.float32(0.5), lower_up)
  small = upper_half.astype(jnp.int32) + up.astype(jnp.int32)
  return _with_sign(jnp.where(b < _ONE, small, normal), x)


def rtn_e4m3(x: jnp.ndarray) -> jnp.ndarray:
  """Float32 values of ``x`` rounded to the E4M3 grid, nearest-even, saturated to ±448 (Inf too). NaN stays NaN.

  ``round_half_even(x · 2^-e) · 2^e`` with ``2^e`` the grid spacing at ``|x|`` (``formats.e4m3_step_exponent``),
  after clipping to ±448: both scalings are by powers of two, so only the rounding to an integer rounds. (Not the
  bit-level form: with it, Triton recomputes in the quantize kernels the block scale for every element it is
  broadcast to.)

  Args:
    x: float array, any shape (cast to float32).

  Returns:
    float32 array of ``x``'s shape whose values lie on the E4M3 grid (or are NaN).
  """
  x = jnp.clip(x.astype(jnp.float32), -E4M3_MAX, E4M3_MAX)
  e = e4m3_step_exponent(x)
  return jnp.round(x * pow2(-e)) * pow2(e)


def sr_e4m3(x: jnp.ndarray, bits: jnp.ndarray) -> jnp.ndarray:
  """Float32 values of ``x >= 0`` stochastically rounded to the E4M3 grid (unbiased below 448), saturated at 448.

  With ``s = min(x, 448) · 2^-e`` (``2^e`` the grid spacing at ``x``; exact), rounds ``s`` up to ``floor(s) + 1``
  iff ``u · 2^-20 < s - floor(s)``, ``u = bits >> 12`` (20 bits), then scales back by ``2^e``. Exact comparisons:
  above 2^-6 the fraction has at most 20 bits, so up happens with probability ``(x - lo) / 2^e`` exactly; below,
  to within 2^-20. NaN stays NaN.

  Args:
    x: non-negative float array, any shape (cast to float32; negative values are clipped to 0).
    bits: uint32 random bits of ``x``'s shape.

  Returns:
    float32 array of ``x``'s shape whose values lie on the E4M3 grid in [0, 448] (or are NaN).
  """
  x = jnp.clip(x.astype(jnp.float32), 0.0, E4M3_MAX)
  e = e4m3_step_exponent(x)
  s = x * pow2(-e)
  lo = jnp.floor(s)
  u = (bits.astype(jnp.uint32) >> 12).astype(jnp.float32) * jnp.float32(2.0**-20)
  return jnp.minimum((lo + (u < s - lo).astype(jnp.float32)) * pow2(e), E4M3_MAX)


def rtn_bf16(x: jnp.ndarray) -> jnp.ndarray:
  """Float32 ``x`` rounded to the nearest bfloat16 value (ties to even), returned as float32. NaN stays NaN.

  Bit form: ``b = bits(x); b += 0x7FFF + ((b >> 16) & 1); b &= 0xFFFF0000`` (Inf stays Inf, overflow goes to Inf).

  Args:
    x: float array, any shape (cast to float32).

  Returns:
    float32 array of ``x``'s shape whose values are exactly representable in bfloat16.
  """
  x = x.astype(jnp.float32)
  b = lax.bitcast_convert_type(x, jnp.uint32)
  rounded = (b + jnp.uint32(0x7FFF) + ((b >> 16) & jnp.uint32(1))) & jnp.uint32(0xFFFF0000)
  return jnp.where(jnp.isnan(x), x, lax.bitcast_convert_type(rounded, jnp.float32))
