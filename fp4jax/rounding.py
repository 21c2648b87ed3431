"""Rounding onto the E2M1, E4M3 and BF16 grids by explicit arithmetic.

No function here relies on a dtype conversion to round: XLA on GPU deletes convert pairs under ``jit``.
Every rounding is written with comparisons, ``floor``/``round`` on exactly scaled values and bit operations,
so the results are identical on CPU and GPU.

Rules (OCP MX v1.0; NVIDIA PTX ``cvt.rn.satfinite`` / ``cvt.rs``):
* RTN, E2M1: nearest grid value, ties to the even code; decision points on magnitudes
  [0, .25] -> 0, (.25, .75) -> .5, [.75, 1.25] -> 1, (1.25, 1.75) -> 1.5, [1.75, 2.5] -> 2, (2.5, 3.5) -> 3,
  [3.5, 5] -> 4, > 5 -> 6; saturating at 6. The sign bit is set for ``x < 0`` (so -0.0 -> code 0, -0.1 -> code 8),
  as in Transformer Engine's reference ``cast_to_fp4x2``.
* SR, E2M1: with ``lo <= |x| < hi`` the neighbouring grid values, round up with probability ``(|x| - lo)/(hi - lo)``,
  using a 24-bit uniform ``u``: up iff ``u * (hi - lo) < |x| - lo`` (both sides exact). Unbiased inside [-6, 6].
* E4M3 (``float8_e4m3fn``): 3 mantissa bits, exponents -6..8, subnormal step 2^-9, max 448; RNE on the value scaled
  by the grid quantum, which is exact.
"""

from __future__ import annotations

import jax.lax as lax
import jax.numpy as jnp

from fp4jax import bits as bits_lib
from fp4jax.formats import E2M1_MAX, E2M1_SIGN_BIT, E4M3_MAX, e2m1_decode, e4m3_quantum

# Magnitude thresholds of RTN-even: code k+1 is reached at t_k, with ">" for ties that go down (odd code above)
# and ">=" for ties that go up (even code above).
_RTN_UP_STRICT = (0.25, 1.25, 2.5, 5.0)
_RTN_UP_INCLUSIVE = (0.75, 1.75, 3.5)
_GRID_POSITIVE = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _with_sign(mag_code: jnp.ndarray, x: jnp.ndarray) -> jnp.ndarray:
  return (mag_code + jnp.where(x < 0, E2M1_SIGN_BIT, 0)).astype(jnp.uint8)


def rtn_e2m1(x: jnp.ndarray) -> jnp.ndarray:
  """E2M1 codes (uint8 0..15) of float32 ``x`` by round-to-nearest, ties to even, saturating at ±6.

  NaN maps to code 0; callers keep NaN alive through the block scale (see ``fp4jax.quantize``).
  """
  a = jnp.abs(x.astype(jnp.float32))
  code = sum((a > t).astype(jnp.int32) for t in _RTN_UP_STRICT)
  code = code + sum((a >= t).astype(jnp.int32) for t in _RTN_UP_INCLUSIVE)
  return _with_sign(code, x)


def sr_e2m1(x: jnp.ndarray, bits: jnp.ndarray) -> jnp.ndarray:
  """E2M1 codes of float32 ``x`` by stochastic rounding with uint32 ``bits`` (same shape); saturates at ±6.

  ``P(up) = (|x| - lo)/(hi - lo)``, so ``E[value(q)] = x`` for |x| <= 6 (to the 2^-24 resolution of ``u``).
  """
  a = jnp.minimum(jnp.abs(x.astype(jnp.float32)), E2M1_MAX)
  floor_code = sum((a >= g).astype(jnp.int32) for g in _GRID_POSITIVE)
  lo = e2m1_decode(floor_code)
  gap = e2m1_decode(jnp.minimum(floor_code + 1, 7)) - lo
  u = bits_lib.uniform_from_bits(bits)
  up = (u * gap < a - lo).astype(jnp.int32)
  return _with_sign(floor_code + up, x)


def rtn_e4m3(x: jnp.ndarray) -> jnp.ndarray:
  """Float32 values of ``x`` rounded to the E4M3 grid, nearest-even, saturated to ±448. NaN stays NaN."""
  x = jnp.clip(x.astype(jnp.float32), -E4M3_MAX, E4M3_MAX)
  q = e4m3_quantum(x)
  return jnp.clip(jnp.round(x / q) * q, -E4M3_MAX, E4M3_MAX)


def sr_e4m3(x: jnp.ndarray, bits: jnp.ndarray) -> jnp.ndarray:
  """Float32 values of ``x >= 0`` stochastically rounded to the E4M3 grid (unbiased below 448), saturated at 448.

  ``lo = floor(x/q)*q`` with ``q`` the grid quantum at ``x``; round up to ``lo + q`` iff ``u*q < x - lo``.
  """
  x = jnp.clip(x.astype(jnp.float32), 0.0, E4M3_MAX)
  q = e4m3_quantum(x)
  lo = jnp.floor(x / q) * q
  up = bits_lib.uniform_from_bits(bits) * q < x - lo
  return jnp.minimum(jnp.where(up, lo + q, lo), E4M3_MAX)


def rtn_bf16(x: jnp.ndarray) -> jnp.ndarray:
  """Float32 ``x`` rounded to the nearest bfloat16 value (ties to even), returned as float32. NaN stays NaN.

  Bit form: ``b = bits(x); b += 0x7FFF + ((b >> 16) & 1); b &= 0xFFFF0000`` (Inf stays Inf, overflow goes to Inf).
  """
  x = x.astype(jnp.float32)
  b = lax.bitcast_convert_type(x, jnp.uint32)
  rounded = (b + jnp.uint32(0x7FFF) + ((b >> 16) & jnp.uint32(1))) & jnp.uint32(0xFFFF0000)
  return jnp.where(jnp.isnan(x), x, lax.bitcast_convert_type(rounded, jnp.float32))
