"""Rounding onto the E2M1, E4M3 and BF16 grids by explicit arithmetic.

No function here relies on a dtype conversion to round: XLA on GPU deletes convert pairs under ``jit``.
Every rounding is written with comparisons, ``floor``/``round`` on exactly scaled values and bit operations,
so the results are identical on CPU and GPU.

Rules (OCP MX v1.0; NVIDIA PTX ``cvt.rn.satfinite`` / ``cvt.rs``):
* RTN, E2M1: nearest grid value, ties to the even code; decision points on magnitudes
  [0, .25] -> 0, (.25, .75) -> .5, [.75, 1.25] -> 1, (1.25, 1.75) -> 1.5, [1.75, 2.5] -> 2, (2.5, 3.5) -> 3,
  [3.5, 5] -> 4, > 5 -> 6; saturating at 6 (Inf and NaN too). The sign bit is set for ``x < 0`` (so -0.0 -> code 0,
  -0.1 -> code 8), as in Transformer Engine's reference ``cast_to_fp4x2``.
* SR, E2M1: with ``lo <= |x| < hi`` the neighbouring grid values, round up with probability ``(|x| - lo)/(hi - lo)``,
  up iff a uniform ``u`` (22 bits for |x| >= 1, where the fraction has 22 bits; 24 below) is smaller than it,
  compared exactly. Unbiased inside [-6, 6].
* E4M3 (``float8_e4m3fn``): 3 mantissa bits, exponents -6..8, subnormal step 2^-9, max 448; RTN ties to even,
  saturating; SR with 20 random bits, unbiased below 448.

E2M1 and E4M3 rounding work on the float32 bits with integer operations (about 12 per element for E2M1 RTN): they
run inside every quantize kernel (E4M3 once per block scale), where the operation count, not memory, sets the speed.
"""

from __future__ import annotations

import jax.lax as lax
import jax.numpy as jnp

from fp4jax.formats import E2M1_SIGN_BIT

_MAGNITUDE = 0x7FFFFFFF  # float32 bits without the sign
_SIX = 0x40C00000  # bits of 6.0
_ONE = 0x3F800000  # bits of 1.0
_HALF = 0x3F000000  # bits of 0.5
_SUBNORMAL_MAGIC = 6291456.0  # 1.5 · 2^22, whose ulp is 0.5: E2M1's step below 1
_SUBNORMAL_MAGIC_BITS = 0x4AC00000
_SIGN = -0x80000000  # the float32 sign bit as int32
_INF_BITS = 0x7F800000
_E4M3_MAX_BITS = 0x43E00000  # bits of 448.0
_E4M3_MIN_NORMAL_BITS = 0x3C800000  # bits of 2^-6
_E4M3_SUBNORMAL_MAGIC = 24576.0  # 1.5 · 2^14, whose ulp is 2^-9: E4M3's subnormal step
_E4M3_SUBNORMAL_MAGIC_BITS = 0x46C00000


def _saturated_magnitude(x: jnp.ndarray) -> jnp.ndarray:
  """int32 bits of min(|x|, 6) for float32 ``x`` (an integer min: Inf and NaN saturate to 6 on every backend)."""
  return jnp.minimum(lax.bitcast_convert_type(x, jnp.int32) & _MAGNITUDE, _SIX)


def _with_sign(mag_code: jnp.ndarray, x: jnp.ndarray) -> jnp.ndarray:
  """Sets the sign bit for ``x < 0`` (-0.0 and NaN excluded), as an integer compare on the bits, so no backend's
  denormal flushing or NaN sign changes it: ``bits(x) - 1`` (wrapping) is below ``bits(-Inf)`` exactly then."""
  negative = lax.bitcast_convert_type(x, jnp.int32) - 1 < -0x800000
  return (mag_code | jnp.where(negative, E2M1_SIGN_BIT, 0)).astype(jnp.uint8)


def rtn_e2m1(x: jnp.ndarray) -> jnp.ndarray:
  """E2M1 codes (uint8 0..15) of float32 ``x`` by round-to-nearest, ties to even, saturating at ±6 (NaN -> ±6).

  On the bits ``b`` of ``a = min(|x|, 6)``: for ``a >= 1`` E2M1 keeps the exponent and the top mantissa bit, so
  the magnitude code is ``(b + 0x1FFFFF + bit22(b) - bits(0.5)) >> 22`` (round half to even on bit 22; a carry
  moves to the next binade); for ``a < 1`` the step is 0.5 and ``bits(a + 1.5·2^22) - bits(1.5·2^22)`` counts
  the halves of ``a``, rounded to nearest even by the float addition itself. About 12 operations per element.
  """
  x = x.astype(jnp.float32)
  b = _saturated_magnitude(x)
  normal = (b + (0x1FFFFF - _HALF) + ((b >> 22) & 1)) >> 22
  a = lax.bitcast_convert_type(b, jnp.float32)
  small = lax.bitcast_convert_type(a + jnp.float32(_SUBNORMAL_MAGIC), jnp.int32) - _SUBNORMAL_MAGIC_BITS
  return _with_sign(jnp.where(b < _ONE, small, normal), x)


def sr_e2m1(x: jnp.ndarray, bits: jnp.ndarray) -> jnp.ndarray:
  """E2M1 codes of float32 ``x`` by stochastic rounding with uint32 ``bits`` (same shape); saturates at ±6.

  With ``lo <= a = min(|x|, 6) < hi`` the neighbouring grid values, rounds up iff ``u < (a - lo)/(hi - lo)``:
  for ``a >= 1`` that fraction is the 22 mantissa bits of ``a`` below E2M1's, compared with ``u = bits >> 10``
  (22 bits) as ``(b - u + 0x3FFFFF - bits(0.5)) >> 22`` (a carry into bit 22 iff ``u`` is smaller); for ``a < 1``,
  ``u = (bits >> 8)·2^-24`` and up iff ``u·0.5 < a - lo`` (exact). ``E[value(q)] = x`` exactly for ``|x| <= 6``.
  Both ranges decide as ``(bits >> 8)·2^-24 < (a - lo)/(hi - lo)`` would: same bits, same codes.
  """
  x = x.astype(jnp.float32)
  bits = bits.astype(jnp.uint32)
  b = _saturated_magnitude(x)
  normal = (b - (bits >> 10).astype(jnp.int32) + (0x3FFFFF - _HALF)) >> 22
  a = lax.bitcast_convert_type(b, jnp.float32)
  upper_half = b >= _HALF
  u_gap = (bits >> 8).astype(jnp.float32) * jnp.float32(2.0**-25)  # u · 0.5, exact
  up = u_gap < a - jnp.where(upper_half, jnp.float32(0.5), jnp.float32(0.0))
  small = upper_half.astype(jnp.int32) + up.astype(jnp.int32)
  return _with_sign(jnp.where(b < _ONE, small, normal), x)


def rtn_e4m3(x: jnp.ndarray) -> jnp.ndarray:
  """Float32 values of ``x`` rounded to the E4M3 grid, nearest-even, saturated to ±448 (Inf too). NaN stays NaN.

  On the magnitude bits ``m``: for ``|x| >= 2^-6`` E4M3 keeps the exponent and 3 mantissa bits, so the rounded
  bits are ``(m + 0x7FFFF + bit20(m)) & ~0xFFFFF`` (round half to even on bit 20; a carry moves to the next
  binade), then an integer min with bits(448); below 2^-6 the step is 2^-9 and ``bits(|x| + 1.5·2^14) -
  bits(1.5·2^14)`` counts the steps, rounded to nearest even by the float addition itself. The sign is copied.
  """
  x = x.astype(jnp.float32)
  b = lax.bitcast_convert_type(x, jnp.int32)
  m = b & _MAGNITUDE
  normal = jnp.minimum((m + 0x7FFFF + ((m >> 20) & 1)) & ~0xFFFFF, _E4M3_MAX_BITS)
  a = lax.bitcast_convert_type(m, jnp.float32)
  steps = lax.bitcast_convert_type(a + jnp.float32(_E4M3_SUBNORMAL_MAGIC), jnp.int32) - _E4M3_SUBNORMAL_MAGIC_BITS
  small = lax.bitcast_convert_type(steps.astype(jnp.float32) * jnp.float32(2.0**-9), jnp.int32)
  mag = jnp.where(m < _E4M3_MIN_NORMAL_BITS, small, normal)
  out = lax.bitcast_convert_type(mag | (b & _SIGN), jnp.float32)
  return jnp.where(m > _INF_BITS, x, out)


def sr_e4m3(x: jnp.ndarray, bits: jnp.ndarray) -> jnp.ndarray:
  """Float32 values of ``x >= 0`` stochastically rounded to the E4M3 grid (unbiased below 448), saturated at 448.

  With ``lo <= x < lo + q`` neighbours on the grid (step ``q``), rounds up with probability ``(x - lo)/q``: for
  ``x >= 2^-6`` up iff ``u = bits >> 12`` (20 bits) is below the 20 mantissa bits under E4M3's three, as the carry
  of ``m + 0xFFFFF - u`` into bit 20 (exact); below 2^-6 (q = 2^-9) up iff ``u·2^-20 < frac(x·2^9)`` (exact).
  NaN stays NaN.
  """
  x = x.astype(jnp.float32)
  bits = bits.astype(jnp.uint32)
  m = jnp.minimum(lax.bitcast_convert_type(jnp.maximum(x, 0.0), jnp.int32), _E4M3_MAX_BITS)
  u = (bits >> 12).astype(jnp.int32)
  normal = (m + (0xFFFFF - u)) & ~0xFFFFF
  steps = lax.bitcast_convert_type(m, jnp.float32) * jnp.float32(512.0)  # exact: a power-of-two scaling
  lo = jnp.floor(steps)
  small = (lo + (u.astype(jnp.float32) * jnp.float32(2.0**-20) < steps - lo).astype(jnp.float32)) * jnp.float32(2.0**-9)
  out = jnp.where(m < _E4M3_MIN_NORMAL_BITS, small, lax.bitcast_convert_type(normal, jnp.float32))
  return jnp.where(jnp.isnan(x), x, out)


def rtn_bf16(x: jnp.ndarray) -> jnp.ndarray:
  """Float32 ``x`` rounded to the nearest bfloat16 value (ties to even), returned as float32. NaN stays NaN.

  Bit form: ``b = bits(x); b += 0x7FFF + ((b >> 16) & 1); b &= 0xFFFF0000`` (Inf stays Inf, overflow goes to Inf).
  """
  x = x.astype(jnp.float32)
  b = lax.bitcast_convert_type(x, jnp.uint32)
  rounded = (b + jnp.uint32(0x7FFF) + ((b >> 16) & jnp.uint32(1))) & jnp.uint32(0xFFFF0000)
  return jnp.where(jnp.isnan(x), x, lax.bitcast_convert_type(rounded, jnp.float32))
