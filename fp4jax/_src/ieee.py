"""Correctly rounded float32 division on every XLA backend.

XLA:GPU lowers float32 division to PTX ``div.full.f32``, which is up to 1 ulp off (about a quarter of random
quotients; openxla/xla#37181), and Pallas/Triton does the same. TE's quantizer formulas divide (``2688 / amax``,
``1 / (dec_b · s_dec)``), so an fp32 division that differs between CPU and GPU changes scales and codes.

``div_rn`` returns the IEEE round-to-nearest-even quotient of normal float32 operands. With 24-bit significands
A, B (hidden bit set) and s = 23 (A >= B) or 24 (A < B), the significand quotient is N / B with N = A · 2^s:

1. guess Q from the backend's own division of the significands (at most 2 ulp off, so |N − Q·B| < 3B);
2. the remainder R = N − Q·B is small, so it is exact in wrapping uint32 arithmetic (the high bits cancel);
3. two correction steps each way make 0 <= R < B (Q = floor(N / B)); round up iff 2R > B, or 2R = B and Q is odd.

Only integer operations decide the result, so no backend can reassociate or contract them. Subnormal operands are
normalized first and quotients that are subnormal or overflow are rounded by ``round_pack`` (IEEE gradual underflow,
overflow to Inf), so the result never depends on a backend flushing subnormals; zeros, infinities and NaNs fall
back to the backend's own division. On CUDA GPUs ``div_rn`` instead divides the operands widened to float64 and
rounds the quotient once to float32: the same IEEE quotient (double rounding from 53 bits to 24 is innocuous for
division), in a few operations.

The same integer rounding gives exact products: ``mul_rn`` (any two float32 values, times a power of two),
``mul_pow2_rn`` (``x·num·2^k``, num 1 or 3: the MX element scaling; ``mul_pow2_rn_f32`` where ``2^k`` is a float32),
``mul_short_rn`` (a product whose first factor has at most 7 significant bits: E2M1 values times E4M3 / E8M0 scales,
and those times a tensor scale),
``mul_unflushed`` (the IEEE product by the backend's float multiply where it keeps subnormals, ``mul_rn`` on the
CPU), and exact sums: ``add_rn``. XLA on CPU flushes float32 subnormals (inputs and results) to zero and XLA on GPU
does not; these functions return the IEEE result (subnormals kept) on both. On the CPU ``mul_short_rn``,
``mul_unflushed`` and ``mul_pow2_rn_f32`` take XLA's float product for a tensor none of whose operands or products
is subnormal (one ``lax.cond`` per tensor, ``_cpu_native_or``): IEEE there, the same bits, without the integer work.
"""

from __future__ import annotations

import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np

_MANT = np.uint32(0x7FFFFF)
_HIDDEN = np.uint32(0x800000)
_ONE = np.uint32(0x3F800000)  # bits of 1.0f
_INF = np.uint32(0x7F800000)
_U1 = np.uint32(1)


def significand(x: jnp.ndarray):
  """``(sign, m, lsb)`` of float32 ``x`` with ``|x| = m · 2^lsb``: ``m`` uint32 in [2^23, 2^24) (subnormals
  normalized; 0 for zero), ``lsb`` int32. Meaningless for Inf/NaN."""
  b = lax.bitcast_convert_type(x, jnp.uint32)
  biased = ((b >> 23) & jnp.uint32(0xFF)).astype(jnp.int32)
  normal = biased > 0
  m = jnp.where(normal, (b & _MANT) | _HIDDEN, b & _MANT)
  lsb = jnp.where(normal, biased - jnp.int32(150), jnp.int32(-149))
  shift = jnp.clip(lax.clz(m).astype(jnp.int32) - jnp.int32(8), 0, 23)
  return b >> 31, m << shift.astype(jnp.uint32), lsb - shift


def widen(x: jnp.ndarray) -> jnp.ndarray:
  """``x`` as float32: the exact value of a bfloat16 or float16 array by integer operations on its bits, other dtypes
  by ``astype``. Every quantizer reads its operand through it.

  Why: under ``jit``, XLA may drop a conversion pair float32 -> bfloat16 -> float32 (``--xla_allow_excess_precision``,
  on by default; XLA:GPU does it across fusions). A quantizer fused with the op that produced its bfloat16 operand
  would then read the unrounded float32 values, where a kernel reading the operand from memory reads the rounded
  ones: one program would give different codes with the XLA quantizers and with the Pallas kernels. No pass folds
  integer operations into the producer's conversion.

  bfloat16: the bits shifted into a float32's high half. float16 (1 sign, 5 exponent, 10 fraction bits, bias 15): a
  normal ``(-1)^s·1.f·2^(e-15)`` becomes the float32 with exponent ``e + 112`` and fraction ``f << 13``; Inf and NaN
  (``e = 31``) keep their fraction; zeros and subnormals are ``f · 2^-24`` (``f < 2^10``: an exact float32 product
  with a normal result), with the sign.
  """
  if x.dtype == jnp.bfloat16:
    return lax.bitcast_convert_type(lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32) << 16, jnp.float32)
  if x.dtype != jnp.float16:
    return x.astype(jnp.float32)
  h = lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
  sign, e, f = (h >> 15) << 31, (h >> 10) & jnp.uint32(0x1F), h & jnp.uint32(0x3FF)
  e32 = jnp.where(e == 31, jnp.uint32(0xFF), e + jnp.uint32(112))
  normal = lax.bitcast_convert_type(sign | (e32 << 23) | (f << 13), jnp.float32)
  small = lax.bitcast_convert_type(
    sign | lax.bitcast_convert_type(f.astype(jnp.float32) * jnp.float32(2.0**-24), jnp.uint32), jnp.float32
  )
  return jnp.where(e == 0, small, normal)


def _finite(x: jnp.ndarray) -> jnp.ndarray:
  return (lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0x7FFFFFFF)) < _INF


def _special(a: jnp.ndarray, b: jnp.ndarray, op) -> jnp.ndarray:
  """``op(a, b)`` by the backend where an operand is zero, Inf or NaN: a subnormal other operand is replaced by
  ±1 first (same sign, so the same zero / Inf / NaN result) so that a flushing backend cannot turn 0·Inf into NaN."""

  def unflushed(x):
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    sub = ((bits & _INF) == 0) & ((bits & _MANT) != 0)
    return jnp.where(sub, lax.bitcast_convert_type((bits & jnp.uint32(0x80000000)) | _ONE, jnp.float32), x)

  return op(unflushed(a), unflushed(b))


def round_pack(sign: jnp.ndarray, p: jnp.ndarray, lsb: jnp.ndarray, sticky: jnp.ndarray | None = None) -> jnp.ndarray:
  """The float32 nearest (ties to even) to ``(-1)^sign · (p + δ) · 2^lsb``, subnormal results included (IEEE
  gradual underflow), Inf beyond FLT_MAX.

  Args:
    sign: uint32 0 or 1.
    p: uint32 integer below 2^31.
    lsb: int32 exponent of ``p``'s unit.
    sticky: bool, ``δ`` in (0, 1) where True, 0 where False (None: all False).

  Returns:
    float32 array: bits ``((t + 149) << 23) + r`` with ``t = max(exponent(p·2^lsb) - 23, -149)`` the result's unit
    and ``r`` the rounded ``(p + δ)·2^(lsb - t)`` (a carry to 2^24 steps the exponent, as in IEEE).
  """
  sticky = jnp.zeros(p.shape, jnp.bool_) if sticky is None else sticky
  h = jnp.int32(31) - lax.clz(p).astype(jnp.int32)
  t = jnp.maximum(h + lsb - jnp.int32(23), jnp.int32(-149))
  sh = t - lsb
  left = p << jnp.clip(-sh, 0, 31).astype(jnp.uint32)
  shc = jnp.clip(sh, 1, 31).astype(jnp.uint32)
  keep = p >> shc
  rem = p & ((_U1 << shc) - _U1)
  half = _U1 << (shc - _U1)
  up = (rem > half) | ((rem == half) & (sticky | ((keep & _U1) == _U1)))
  right = jnp.where(sh > 31, jnp.uint32(0), keep + up.astype(jnp.uint32))
  r = jnp.where(sh <= 0, left, right)
  bits = ((t + jnp.int32(149)).astype(jnp.uint32) << 23) + r
  bits = jnp.where(p == 0, jnp.uint32(0), jnp.minimum(bits, _INF))
  return lax.bitcast_convert_type(bits | (sign << 31), jnp.float32)


def mul_pow2_rn(x: jnp.ndarray, k: jnp.ndarray, num: int = 1) -> jnp.ndarray:
  """``x · num · 2^k`` in float32 rounded once (nearest, ties to even; subnormal results kept, Inf on overflow).

  Exact integer arithmetic on the bits: subnormal ``x`` counts at its value on every backend. Inf and NaN pass
  through unchanged.

  Args:
    x: float32 array.
    k: int32 exponent (broadcasts against ``x``).
    num: 1 or 3 (static): ``x · 3 · 2^k`` rounded once is ``x · 0.75 · 2^(k+2)``.

  Returns:
    float32 array of the broadcast shape.

  Raises:
    ValueError: ``num`` is not 1 or 3.
  """
  if num not in (1, 3):
    raise ValueError(f"mul_pow2_rn: num must be 1 or 3, got {num}")
  return (mul_pow2_rn1 if num == 1 else mul_pow2_rn3)(x, jnp.asarray(k).astype(jnp.int32))


def _mul_pow2(x: jnp.ndarray, k: jnp.ndarray, num: int) -> jnp.ndarray:
  x = jnp.asarray(x, jnp.float32)
  sign, m, lsb = significand(x)
  y = round_pack(sign, m * jnp.uint32(num), lsb + k)
  return jnp.where(_finite(x), y, x)


_SAFE_MIN = np.int32(0x01000000)  # bits of 2^-125: a float result at least this large is normal, never flushed
_MAG = np.int32(0x7FFFFFFF)


def _magnitude_bits(x: jnp.ndarray) -> jnp.ndarray:
  return lax.bitcast_convert_type(x, jnp.int32) & _MAG


def _is_zero(x: jnp.ndarray) -> jnp.ndarray:
  return _magnitude_bits(x) == 0


def _finite_at_least(x: jnp.ndarray, smallest_bits) -> jnp.ndarray:
  mag = _magnitude_bits(x)
  return (mag >= smallest_bits) & (mag < np.int32(0x7F800000))


def _normal_or_zero(x: jnp.ndarray) -> jnp.ndarray:
  """Finite and not subnormal: what XLA:CPU's float arithmetic reads as written (it flushes subnormal operands)."""
  return _is_zero(x) | _finite_at_least(x, np.int32(0x00800000))


def _unflushed_result(r: jnp.ndarray, zero: jnp.ndarray) -> jnp.ndarray:
  """A float result that XLA:CPU computed as IEEE does: at least 2^-125 and finite (normal, so not flushed; 2^-125,
  not 2^-126, so that no tininess rule is involved), or zero where the exact result is zero (``zero``)."""
  return jnp.where(zero, _is_zero(r), _finite_at_least(r, _SAFE_MIN))


def _cpu_native_or(exact, native, safe, *args):
  """On the CPU, the float op ``native(*args)`` where ``safe(*args, result)`` holds for every element (normal
  operands and results, where XLA:CPU's float arithmetic is IEEE: nothing to flush), else ``exact(*args)`` (integer
  arithmetic, IEEE with subnormals), chosen for the whole tensor by one ``lax.cond``; the same bits either way, and
  the integer path's work only where a subnormal can occur. Elsewhere ``exact``."""

  def cpu(*xs):
    r = native(*xs)
    return lax.cond(jnp.all(safe(*xs, r)), lambda: r, lambda: exact(*xs))

  return lax.platform_dependent(*args, cpu=cpu, default=exact)


def _product_safe(a, b, r):
  return _normal_or_zero(a) & _normal_or_zero(b) & _unflushed_result(r, _is_zero(a) | _is_zero(b))


@jax.jit  # named calls in jaxprs: GPU Pallas kernels run them as PTX mul.rn.f32 (fp4jax_kernels.triton_compat)
def mul_pow2_rn1(x: jnp.ndarray, k: jnp.ndarray) -> jnp.ndarray:
  """``mul_pow2_rn(x, k, 1)``."""
  return _mul_pow2(x, k, 1)


@jax.jit
def mul_pow2_rn3(x: jnp.ndarray, k: jnp.ndarray) -> jnp.ndarray:
  """``mul_pow2_rn(x, k, 3)``."""
  return _mul_pow2(x, k, 3)


@jax.jit  # a named call in jaxprs: GPU Pallas kernels run it as one PTX mul.rn.f32 by the float32 2^k
def mul_pow2_rn_f32(x: jnp.ndarray, k: jnp.ndarray) -> jnp.ndarray:
  """``mul_pow2_rn(x, k)`` for int32 ``k`` in [-149, 127], where ``2^k`` is a float32 (``pow2(k)``, subnormal below
  -126): the same bits, the IEEE product ``x · 2^k`` rounded once.

  Every backend computes it as ``mul_pow2_rn``; the range lets a GPU kernel compute it as one IEEE product by
  ``pow2(k)`` (``mul_pow2_rn`` takes ``k`` up to 254 and needs two). Callers guarantee the range: the E8M0 exponents
  (in [-127, 127]) and block exponents capped at 127.
  """
  x, k = jnp.broadcast_arrays(jnp.asarray(x, jnp.float32), jnp.asarray(k).astype(jnp.int32))
  return _cpu_native_or(_mul_pow2_exact, _mul_pow2_float, _mul_pow2_safe, x, k)


def _mul_pow2_exact(x, k):
  return _mul_pow2(x, k, 1)


def _mul_pow2_float(x, k):  # 2^k built on its bits: a normal float32 for k in [-126, 127] (_mul_pow2_safe's range)
  return x * lax.bitcast_convert_type((jnp.clip(k, -126, 127) + 127) << 23, jnp.float32)


def _mul_pow2_safe(x, k, r):
  return (k >= -126) & (k <= 127) & _normal_or_zero(x) & _unflushed_result(r, _is_zero(x))


@jax.jit  # a named call in jaxprs: GPU Pallas kernels run it as PTX mul.rn.f32 (fp4jax_kernels.triton_compat)
def mul_unflushed(x: jnp.ndarray, y: jnp.ndarray) -> jnp.ndarray:
  """``x · y`` in float32 rounded once: the IEEE product (nearest, ties to even; subnormal operands and results kept,
  Inf on overflow), on every backend. So a product that is subnormal keeps its value and sign: the E2M1 code of a
  negative ``x · enc`` that IEEE rounds to a nonzero subnormal is -0 (0x8) everywhere, and one that IEEE rounds to
  ±0 (``|x · enc| <= 2^-150``) is +0 (0x0) everywhere.

  Per backend (``lax.platform_dependent``): on CUDA and ROCm GPUs, whose fp32 multiply keeps subnormal results, the
  float product, with a subnormal ``x`` first rescaled on its bits as ``(x · 2^64) · (y · 2^-64)`` (both scalings
  exact) so that a backend flushing subnormal operands still counts it (``_rescaled_product``: IEEE only where the
  backend keeps subnormal results); on the CPU (whose XLA flushes subnormal operands and results to zero) the float
  product where no operand or product of the tensor is subnormal, else ``mul_rn`` (``_cpu_native_or``); on any other
  backend ``mul_rn`` (exact integer arithmetic, IEEE everywhere).
  """
  x, y = jnp.broadcast_arrays(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
  cpu = lambda x, y: _cpu_native_or(mul_rn, lax.mul, _product_safe, x, y)  # noqa: E731
  return lax.platform_dependent(x, y, cpu=cpu, cuda=_rescaled_product, rocm=_rescaled_product, default=mul_rn)


def _rescaled_product(x: jnp.ndarray, y: jnp.ndarray) -> jnp.ndarray:
  """``x · y`` as a float product, a subnormal ``x`` rescaled: ``(x · 2^64) · (y · 2^-64)``. The IEEE product
  wherever the backend's fp32 multiply is (subnormal results kept); a backend that flushes subnormal results (XLA
  on the CPU) flushes a subnormal product here too, but a normal one is exact even for a subnormal ``x``."""
  bits = lax.bitcast_convert_type(x, jnp.uint32)
  sub = (bits & _INF) == 0
  up = (bits & _MANT).astype(jnp.int32).astype(jnp.float32) * jnp.float32(2.0**-85)  # |x| · 2^64, exact
  up = jnp.where((bits >> 31) == 1, -up, up)
  return jnp.where(sub, up, x) * jnp.where(sub, y * jnp.float32(2.0**-64), y)


@jax.jit  # a named call in jaxprs: GPU Pallas kernels run it as PTX mul.rn.f32 (fp4jax_kernels.triton_compat)
def mul_short_rn(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """``a · b`` in float32 rounded once (nearest, ties to even; subnormal operands and results kept, Inf on overflow)
  for finite ``a`` with at most 7 significant bits (an E2M1 value, an E4M3 or E8M0 scale, or their product) and
  any ``b``. Exact integer arithmetic (a 7 x 24-bit product); non-finite operands use the float product. On the
  CPU the float product where no operand or product of the tensor is subnormal (``_cpu_native_or``)."""
  a, b = jnp.broadcast_arrays(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
  return _cpu_native_or(_mul_short_exact, lax.mul, _product_safe, a, b)


def _mul_short_exact(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  sa, ma, la = significand(a)
  sb, mb, lb = significand(b)
  y = round_pack(sa ^ sb, (ma >> 17) * mb, la + lb + jnp.int32(17))
  return jnp.where(_finite(a) & _finite(b), y, _special(a, b, lax.mul))


def mul_rn(a: jnp.ndarray, b: jnp.ndarray, k: jnp.ndarray | int = 0) -> jnp.ndarray:
  """``a · b · 2^k`` in float32 rounded once (nearest, ties to even; subnormal operands and results kept, Inf on
  overflow) for any finite ``a`` and ``b``: the exact 48-bit product of the significands (12-bit limbs in uint32),
  its top 30 bits and a sticky bit rounded by ``round_pack``. Non-finite operands use the float product (``k``
  ignored).

  Args:
    a, b: float32 arrays (broadcast together).
    k: int32 exponent (broadcasts).

  Returns:
    float32 array of the broadcast shape.
  """
  a, b = jnp.broadcast_arrays(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
  sa, ma, la = significand(a)
  sb, mb, lb = significand(b)
  low12 = np.uint32(0xFFF)
  a1, a0, b1, b0 = ma >> 12, ma & low12, mb >> 12, mb & low12
  mid = a1 * b0 + a0 * b1  # < 2^25
  lo = a0 * b0 + ((mid & low12) << 12)  # < 2^25
  hi = a1 * b1 + (mid >> 12) + (lo >> 24)  # product = hi · 2^24 + (lo mod 2^24), hi < 2^24
  p = (hi << 6) | ((lo & np.uint32(0xFFFFFF)) >> 18)  # the product's top 30 bits
  sticky = (lo & np.uint32(0x3FFFF)) != 0
  y = round_pack(sa ^ sb, p, la + lb + jnp.asarray(k, jnp.int32) + jnp.int32(18), sticky)
  return jnp.where(_finite(a) & _finite(b), y, _special(a, b, lax.mul))


def add_rn(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """``a + b`` in float32 rounded once (nearest, ties to even; subnormal operands and results kept, Inf on
  overflow) on every backend, by integer arithmetic: the larger magnitude's significand with 6 guard bits, the
  other's shifted to its exponent with a sticky bit for the bits shifted out, added or subtracted and rounded by
  ``round_pack`` (a difference that cancels leading bits is exact: it only arises from shifts by at most 1). An exact
  zero sum is +0 unless both operands are -0, as IEEE. Non-finite operands use the float sum.

  Args:
    a, b: float32 arrays (broadcast together).

  Returns:
    float32 array of the broadcast shape.
  """
  a, b = jnp.broadcast_arrays(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
  sa, ma, la = significand(a)
  sb, mb, lb = significand(b)
  swap = (lb > la) | ((lb == la) & (mb > ma))  # order by magnitude (a zero has m = 0 and the lowest lsb)
  s1, m1, l1 = jnp.where(swap, sb, sa), jnp.where(swap, mb, ma), jnp.where(swap, lb, la)
  s2, m2, l2 = jnp.where(swap, sa, sb), jnp.where(swap, ma, mb), jnp.where(swap, la, lb)
  shift = jnp.clip(l1 - l2, 0, 31).astype(jnp.uint32)
  small = m2 << 6  # below 2^30: a shift by 31 drops it entirely
  sticky = (small & ((_U1 << shift) - _U1)) != 0
  aligned = small >> shift
  same = s1 == s2
  p = jnp.where(same, (m1 << 6) + aligned, (m1 << 6) - aligned - sticky.astype(jnp.uint32))
  zero = (p == 0) & ~sticky
  sign = jnp.where(zero, sa & sb, s1)
  y = round_pack(sign, p, l1 - jnp.int32(6), sticky)
  y = jnp.where(zero, lax.bitcast_convert_type(sign << 31, jnp.float32), y)
  return jnp.where(_finite(a) & _finite(b), y, _special(a, b, lax.add))


@jax.jit  # a named call in jaxprs: GPU Pallas kernels run it as PTX div.rn.f32 (fp4jax_kernels.triton_compat)
def div_rn(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """``a / b`` in float32, correctly rounded (nearest, ties to even) for finite nonzero operands, subnormal operands
  and quotients included (IEEE: gradual underflow, Inf on overflow); zeros, Inf and NaN use the backend's division.

  Per backend (``lax.platform_dependent``): on CUDA GPUs the float64 quotient of the exactly widened operands,
  rounded once to float32 (``_div_float64``); elsewhere, the CPU included, integer arithmetic (``_div_integer``; no
  ``_cpu_native_or`` float path: XLA:CPU flushes float32 subnormals, also in conversions, and its float quotient is
  not relied on to be IEEE inside fused code). Both give the IEEE quotient, so the same bits; the GPU's is four
  operations where the integer path is a long sequence, which matters where a program divides for every scale."""
  a, b = jnp.broadcast_arrays(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
  return lax.platform_dependent(a, b, cuda=_div_float64, default=_div_integer)


def _div_float64(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """``div_rn`` on a CUDA GPU: ``f32(f64(a) / f64(b))``. The widening is exact (subnormals included: XLA:GPU does not
  flush float32 by default), the float64 division is IEEE (PTX ``div.rn.f64``), and rounding that quotient again to
  float32 gives the correctly rounded float32 quotient: a second rounding to p = 24 bits after one to 53 >= 2p + 2
  is innocuous for division (S. A. Figueroa, "When is double rounding innocuous?", SIGNUM Newsletter 30(3), 1995),
  gradual underflow included (a subnormal float32 quotient has fewer than 24 bits). The float64 operations are traced
  under ``jax.enable_x64`` (the program's other types are unchanged)."""
  with jax.enable_x64(True):
    q = lax.div(lax.convert_element_type(a, np.float64), lax.convert_element_type(b, np.float64))
    return lax.convert_element_type(q, np.float32)


def _div_integer(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """``div_rn`` by integer arithmetic on every backend (the module docstring's steps 1-3)."""
  sa, ma, la = significand(a)
  sb, mb, lb = significand(b)
  small = ma < mb
  # 1. Guess from the significands as floats in [1, 2): their quotient times 2^shift is < 2^25, exact as a float.
  fa = lax.bitcast_convert_type((ma & _MANT) | _ONE, jnp.float32)
  fb = lax.bitcast_convert_type((mb & _MANT) | _ONE, jnp.float32)
  scale = jnp.where(small, jnp.float32(2.0**24), jnp.float32(2.0**23))
  q, r = floor_significand_quotient(ma, mb, (fa / fb * scale).astype(jnp.int32).astype(jnp.uint32))
  # a / b = (q + r / mb) · 2^(la - lb - shift); one guard bit and a sticky bit for round_pack
  guard = 2 * r >= mb.astype(jnp.int32)
  sticky = 2 * r != jnp.where(guard, mb.astype(jnp.int32), jnp.int32(0))
  shift = jnp.where(small, jnp.int32(24), jnp.int32(23))
  exact = round_pack(sa ^ sb, (q << 1) | guard.astype(jnp.uint32), la - lb - shift - jnp.int32(1), sticky)
  ok = _finite(a) & _finite(b) & (ma > 0) & (mb > 0)
  return jnp.where(ok, exact, _special(a, b, lax.div))


def floor_significand_quotient(ma: jnp.ndarray, mb: jnp.ndarray, q: jnp.ndarray):
  """Steps 2-3 without the rounding: ``(Q, R)`` with ``Q = floor(N / mb)`` (uint32) and ``R = N - Q·mb`` (int32,
  0 <= R < mb) for 24-bit significands ``ma``, ``mb``, N = ma · 2^(24 if ma < mb else 23), and a guess ``q`` within
  2 of Q."""
  shift = jnp.where(ma < mb, jnp.uint32(24), jnp.uint32(23))
  r = lax.bitcast_convert_type((ma << shift) - q * mb, jnp.int32)
  bi = mb.astype(jnp.int32)
  for _ in range(2):
    neg = r < 0
    q, r = jnp.where(neg, q - _U1, q), jnp.where(neg, r + bi, r)
  for _ in range(2):
    over = r >= bi
    q, r = jnp.where(over, q + _U1, q), jnp.where(over, r - bi, r)
  return q, r
