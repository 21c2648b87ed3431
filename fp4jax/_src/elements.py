"""Element and scale encodings: E2M1 codes, the E4M3 and E8M0 scale constants, exact float32 bit helpers.

E2M1 (OCP MX v1.0, NVIDIA PTX ``e2m1``): 1 sign, 2 exponent, 1 mantissa bit, no Inf/NaN.
Magnitudes by code 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; codes 8..15 are the same magnitudes negated
(the sign is bit 3; code 8 is -0).

Every function here is exact integer/float arithmetic: nothing relies on ``astype`` to round, because
XLA on GPU removes convert pairs under ``jit`` (f32 -> f4 -> f32 is not a rounding there). This module sits below
``fp4jax.rounding`` and ``fp4jax.scaling``; the formats built from them are ``fp4jax.formats``.
"""

from __future__ import annotations

import jax.lax as lax
import jax.numpy as jnp
import numpy as np

E2M1_MAX = 6.0
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
E2M1_SIGN_BIT = 8
E4M3_MAX = 448.0
E4M3_NAN_BITS = 0x7F
F32_INF_BITS = 0x7F800000  # float32 +Inf; every NaN's magnitude bits (sign cleared) are larger
E8M0_NAN_BITS = 0xFF
E8M0_BIAS = 127
FLT_MAX = float(np.finfo(np.float32).max)


def e2m1_decode(codes: jnp.ndarray) -> jnp.ndarray:
  """Value of 4-bit E2M1 codes (uint8 in 0..15) as float32, by building the float32 bit pattern (no table gather).

  Code ``s ee m`` (``k = c & 7`` = ``ee m``): ``e > 0`` -> ``2^(e-1)·(1 + m/2)``, float32 bits
  ``(k << 22) + (126 << 23)``; ``e == 0`` -> ``m/2``, bits ``m · bits(0.5)``; the sign is bit 3 -> bit 31.
  """
  c = codes.astype(jnp.int32)
  k = c & 7
  mag = jnp.where(k > 1, (k << 22) + (126 << 23), k * 0x3F000000)
  return lax.bitcast_convert_type(mag | ((c & E2M1_SIGN_BIT) << 28), jnp.float32)


def pow2(e: jnp.ndarray) -> jnp.ndarray:
  """Exact float32 ``2^e`` for integer ``e`` in [-149, 127], built from the bit pattern."""
  e = e.astype(jnp.int32)
  normal_bits = (jnp.clip(e, -126, 127) + 127).astype(jnp.uint32) << 23
  sub_bits = jnp.uint32(1) << jnp.clip(e + 149, 0, 22).astype(jnp.uint32)
  bits = jnp.where(e >= -126, normal_bits, sub_bits)
  return lax.bitcast_convert_type(bits, jnp.float32)


def floor_log2(x: jnp.ndarray) -> jnp.ndarray:
  """``floor(log2(x))`` for finite ``x > 0`` read from the float32 exponent field (exact, subnormals too).

  Returns int32; the value for ``x == 0`` is -150 (below every representable exponent).
  """
  x = x.astype(jnp.float32)
  bits = lax.bitcast_convert_type(jnp.abs(x), jnp.uint32)
  biased = (bits >> 23).astype(jnp.int32)
  mant = (bits & 0x7FFFFF).astype(jnp.uint32)
  # Subnormal: exponent of the leading mantissa bit, -149 + index of the highest set bit.
  highest = 31 - _clz32(mant)
  sub = -149 + highest
  return jnp.where(biased > 0, biased - 127, jnp.where(mant > 0, sub, -150))


def _clz32(x: jnp.ndarray) -> jnp.ndarray:
  return lax.clz(x.astype(jnp.uint32)).astype(jnp.int32)


def e4m3_step_exponent(x: jnp.ndarray) -> jnp.ndarray:
  """int32 ``e`` with ``2^e`` the spacing of the E4M3 grid at ``|x|``: ``max(floor(log2|x|), -6) - 3`` (-9 in E4M3's
  subnormal range), from the float32 exponent field (below 2^-6 the field's value no longer matters)."""
  biased = (lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32) >> 23) & 0xFF
  return jnp.maximum(biased - 127, -6) - 3


def e4m3_bits(dec: jnp.ndarray) -> jnp.ndarray:
  """uint8 float8_e4m3fn bit pattern of fp32 ``dec >= 0`` lying on the E4M3 grid (exact; NaN -> 0x7F), by integer
  arithmetic (no float8 type: kernel-safe).

  Normal (dec >= 2^-6): ``(E + 7) << 3 | top 3 mantissa bits``; subnormal: ``dec · 2^9`` (0..7).
  """
  b = lax.bitcast_convert_type(dec, jnp.uint32)
  exp = (b >> 23).astype(jnp.int32) - 127
  normal = ((exp + 7) << 3) | ((b >> 20) & 7).astype(jnp.int32)
  sub = (jnp.where(jnp.isnan(dec), 0.0, dec) * jnp.float32(512.0)).astype(jnp.int32)
  out = jnp.where(dec >= jnp.float32(2.0**-6), normal, sub)
  return jnp.where(jnp.isnan(dec), E4M3_NAN_BITS, out).astype(jnp.uint8)


def e4m3_bits_to_f32(bits: jnp.ndarray) -> jnp.ndarray:
  """fp32 value of uint8 ``float8_e4m3fn`` bit patterns (0x7F -> NaN), by integer arithmetic (kernel-safe):
  ``e = (b >> 3) & 15``, ``m = b & 7``; ``2^(e-7)·(1 + m/8)`` for ``e > 0``, else ``m · 2^-9``."""
  b = bits.astype(jnp.int32)
  e, m = (b >> 3) & 15, b & 7
  normal = lax.bitcast_convert_type((((e + 120) << 23) | (m << 20)).astype(jnp.uint32), jnp.float32)
  val = jnp.where(e > 0, normal, m.astype(jnp.float32) * jnp.float32(2.0**-9))
  return jnp.where(b == E4M3_NAN_BITS, jnp.float32(jnp.nan), val)


def e8m0_bits_to_f32(bits: jnp.ndarray) -> jnp.ndarray:
  """fp32 value ``2^(b - 127)`` of uint8 ``float8_e8m0fnu`` bit patterns (0xFF -> NaN), by integer arithmetic
  (kernel-safe; ``b = 0`` gives the subnormal 2^-127 as a constant)."""
  b = bits.astype(jnp.int32)
  val = lax.bitcast_convert_type((jnp.maximum(b, 1) << 23).astype(jnp.uint32), jnp.float32)
  val = jnp.where(b == 0, jnp.float32(2.0**-127), val)
  return jnp.where(b == E8M0_NAN_BITS, jnp.float32(jnp.nan), val)
