"""Correctly rounded float32 division on every XLA backend.

XLA:GPU lowers float32 division to PTX ``div.full.f32``, which is up to 1 ulp off (about a quarter of random
quotients; openxla/xla#37181), and Pallas/Triton does the same. TE's quantizer formulas divide (``2688 / amax``,
``1 / (dec_b · s_dec)``), so an fp32 division that differs between CPU and GPU changes scales and codes.

``div_rn`` computes the IEEE round-to-nearest-even quotient of normal float32 operands with integer long division
of the 24-bit significands (25 shift-subtract steps on uint32, then round half to even on the guard and sticky bits),
which no backend can reassociate or contract. Zeros, infinities, NaNs, subnormal operands and quotients outside the
normal range fall back to the backend's own division (whose special-value semantics are IEEE).
"""

from __future__ import annotations

import jax.lax as lax
import jax.numpy as jnp

_MANT = 0x7FFFFF
_HIDDEN = 0x800000


def _fields(x):
  b = lax.bitcast_convert_type(x, jnp.uint32)
  exp = ((b >> 23) & 0xFF).astype(jnp.int32)
  return b >> 31, exp, (b & _MANT) | _HIDDEN


def div_rn(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """``a / b`` in float32, correctly rounded (nearest, ties to even) for normal operands and results."""
  a, b = jnp.broadcast_arrays(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
  # Opaque operands: XLA's algebraic simplifier otherwise folds a constant operand into the 24 steps and can loop.
  a, b = lax.optimization_barrier((a, b))
  sa, ea, ma = _fields(a)
  sb, eb, mb = _fields(b)
  # Normalize so the significand quotient lies in [1, 2): r = ma (or 2·ma when ma < mb).
  small = ma < mb
  r = jnp.where(small, ma << 1, ma)
  e = ea - eb - small.astype(jnp.int32)
  q = jnp.zeros_like(ma)
  for _ in range(24):  # 24 quotient bits, the leading one first
    bit = r >= mb
    q = (q << 1) | bit.astype(jnp.uint32)
    r = (jnp.where(bit, r - mb, r)) << 1
  guard = r >= mb
  sticky = jnp.where(guard, r - mb, r) != 0
  up = guard & (sticky | ((q & 1) == 1))
  q = q + up.astype(jnp.uint32)
  carry = q >> 24  # rounding overflowed to 2^24
  q = jnp.where(carry == 1, q >> 1, q)
  e = e + carry.astype(jnp.int32)
  biased = e + 127
  bits = ((sa ^ sb) << 31) | (jnp.clip(biased, 1, 254).astype(jnp.uint32) << 23) | (q & _MANT)
  exact = lax.bitcast_convert_type(bits, jnp.float32)
  normal_in = (ea > 0) & (ea < 255) & (eb > 0) & (eb < 255)
  ok = normal_in & (biased >= 1) & (biased <= 254)
  return jnp.where(ok, exact, a / b)
