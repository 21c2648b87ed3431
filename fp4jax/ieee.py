"""Correctly rounded float32 division on every XLA backend.

XLA:GPU lowers float32 division to PTX ``div.full.f32``, which is up to 1 ulp off (about a quarter of random
quotients; openxla/xla#37181), and Pallas/Triton does the same. TE's quantizer formulas divide (``2688 / amax``,
``1 / (dec_b · s_dec)``), so an fp32 division that differs between CPU and GPU changes scales and codes.

``div_rn`` returns the IEEE round-to-nearest-even quotient of normal float32 operands. With 24-bit significands
A, B (hidden bit set) and s = 23 (A >= B) or 24 (A < B), the significand quotient is N / B with N = A · 2^s:

1. guess Q from the backend's own division of the significands (at most 2 ulp off, so |N − Q·B| < 3B);
2. the remainder R = N − Q·B is small, so it is exact in wrapping uint32 arithmetic (the high bits cancel);
3. two correction steps each way make 0 <= R < B (Q = floor(N / B)); round up iff 2R > B, or 2R = B and Q is odd.

Only integer operations decide the result, so no backend can reassociate or contract them. Zeros, infinities,
NaNs, subnormal operands and quotients outside the normal range fall back to the backend's own division.
"""

from __future__ import annotations

import jax
import jax.lax as lax
import jax.numpy as jnp

_MANT = 0x7FFFFF
_HIDDEN = 0x800000
_ONE = 0x3F800000  # bits of 1.0f


def _fields(x):
  b = lax.bitcast_convert_type(x, jnp.uint32)
  exp = ((b >> 23) & 0xFF).astype(jnp.int32)
  return b >> 31, exp, (b & _MANT) | _HIDDEN


@jax.jit  # a named call in jaxprs: GPU Pallas kernels run it as PTX div.rn.f32 (fp4jax_kernels.triton_compat)
def div_rn(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """``a / b`` in float32, correctly rounded (nearest, ties to even) for normal operands and results."""
  a, b = jnp.broadcast_arrays(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
  # Opaque operands: XLA's algebraic simplifier otherwise folds constant operands through the steps and can loop.
  a, b = lax.optimization_barrier((a, b))
  sa, ea, ma = _fields(a)
  sb, eb, mb = _fields(b)
  small = ma < mb
  # 1. Guess from the significands as floats in [1, 2): their quotient times 2^shift is < 2^25, exact as a float.
  fa = lax.bitcast_convert_type((ma & _MANT) | _ONE, jnp.float32)
  fb = lax.bitcast_convert_type((mb & _MANT) | _ONE, jnp.float32)
  scale = jnp.where(small, jnp.float32(2.0**24), jnp.float32(2.0**23))
  q, carry = rounded_significand_quotient(ma, mb, (fa / fb * scale).astype(jnp.int32).astype(jnp.uint32))
  biased = ea - eb - small.astype(jnp.int32) + carry + 127
  bits = ((sa ^ sb) << 31) | (jnp.clip(biased, 1, 254).astype(jnp.uint32) << 23) | (q & _MANT)
  exact = lax.bitcast_convert_type(bits, jnp.float32)
  normal_in = (ea > 0) & (ea < 255) & (eb > 0) & (eb < 255)
  ok = normal_in & (biased >= 1) & (biased <= 254)
  return jnp.where(ok, exact, a / b)


def rounded_significand_quotient(ma: jnp.ndarray, mb: jnp.ndarray, q: jnp.ndarray):
  """Steps 2-3 for 24-bit significands ``ma``, ``mb`` and a guess ``q`` within 2 of floor(N / mb).

  Returns ``(Q, carry)``: the 24-bit significand of round_half_even(N / mb), N = ma · 2^(24 if ma < mb else 23),
  and 1 where rounding carried into the next binade (then Q = 2^23).
  """
  shift = jnp.where(ma < mb, 24, 23).astype(jnp.uint32)
  r = lax.bitcast_convert_type((ma << shift) - q * mb, jnp.int32)
  bi = mb.astype(jnp.int32)
  # 3. Make 0 <= r < mb, then round to nearest even.
  for _ in range(2):
    neg = r < 0
    q, r = jnp.where(neg, q - 1, q), jnp.where(neg, r + bi, r)
  for _ in range(2):
    over = r >= bi
    q, r = jnp.where(over, q + 1, q), jnp.where(over, r - bi, r)
  up = (2 * r > bi) | ((2 * r == bi) & ((q & 1) == 1))
  q = q + up.astype(jnp.uint32)
  carry = (q >> 24).astype(jnp.int32)  # rounding overflowed to 2^24
  return jnp.where(carry == 1, q >> 1, q), carry
