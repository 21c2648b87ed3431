"""Correctly rounded float32 division (``fp4jax.ieee.div_rn``) against float64 NumPy rounded once to float32."""

import re
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4jax._src import ieee
from fp4jax._src.ieee import div_rn, mul_pow2_rn, mul_pow2_rn_f32, mul_rn, mul_short_rn


def test_random_quotients_are_correctly_rounded():
  rng = np.random.RandomState(0)
  n = 200_000
  a = (rng.randn(n) * np.exp2(rng.uniform(-60, 60, n))).astype(np.float32)
  b = (rng.randn(n) * np.exp2(rng.uniform(-60, 60, n))).astype(np.float32)
  expect = (a.astype(np.float64) / b).astype(np.float32)
  got = np.asarray(jax.jit(div_rn)(a, b))
  normal = np.abs(expect) >= np.finfo(np.float32).tiny
  np.testing.assert_array_equal(got[normal], expect[normal])


def test_hard_cases_and_specials():
  a = np.array([3163.328613, 4.6875, 2688.0, 1.0, 1.0, 0.0, 1.0, np.inf, np.nan, 3e38], np.float32)
  b = np.array([3163.328613, 0.9375, 0.3, 3.0, 0.0, 0.0, np.inf, 2.0, 1.0, 1e-5], np.float32)
  got = np.asarray(div_rn(jnp.asarray(a), jnp.asarray(b)))
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    expect = (a.astype(np.float64) / b).astype(np.float32)
  np.testing.assert_array_equal(got, expect)
  # every float32 significand divided by itself is exactly 1
  m = np.arange(1 << 23, (1 << 23) + 4096, dtype=np.uint32) | np.uint32(0x3F800000)
  x = m.view(np.float32) * np.float32(3163.0)
  assert np.all(np.asarray(div_rn(jnp.asarray(x), jnp.asarray(x))) == 1.0)


def test_correction_recovers_from_guesses_two_off():
  """The backend's division may be up to 2 ulp off (div.full.f32 on GPU): every such guess gives the exact floor
  quotient and remainder."""
  from fp4jax._src.ieee import floor_significand_quotient

  rng = np.random.RandomState(1)
  ma = rng.randint(1 << 23, 1 << 24, 5000).astype(np.uint64)
  mb = rng.randint(1 << 23, 1 << 24, 5000).astype(np.uint64)
  n = np.where(ma < mb, ma << 24, ma << 23)
  floor_q, rem = n // mb, n % mb
  for off in (-2, -1, 0, 1, 2):
    q, r = floor_significand_quotient(
      jnp.asarray(ma, jnp.uint32), jnp.asarray(mb, jnp.uint32), jnp.asarray(floor_q.astype(np.int64) + off, jnp.uint32)
    )
    np.testing.assert_array_equal(np.asarray(q), floor_q.astype(np.uint32))
    np.testing.assert_array_equal(np.asarray(r), rem.astype(np.int32))


def _f32_with_subnormals(rng, n, lo=-149, hi=127):
  return (rng.randn(n) * np.exp2(rng.uniform(lo, hi, n))).astype(np.float32)


def _same_bits(got, expect):
  """Bit-equal, except that any NaN matches any NaN."""
  got, expect = np.asarray(got, np.float32), np.asarray(expect, np.float32)
  np.testing.assert_array_equal(np.isnan(got), np.isnan(expect))
  ok = ~np.isnan(expect)
  np.testing.assert_array_equal(got[ok].view(np.uint32), expect[ok].view(np.uint32))


def test_division_with_subnormal_operands_and_quotients_is_ieee():
  """NumPy divides in float64 and rounds once to float32 with gradual underflow (no flushing): XLA's CPU flushes,
  so before the fix 1/2^127 was 0 and 1/subnormal NaN or Inf where IEEE gives a finite or subnormal result."""
  rng = np.random.RandomState(2)
  a, b = _f32_with_subnormals(rng, 100_000), _f32_with_subnormals(rng, 100_000)
  a[::7], b[::11], a[::13], b[::17], a[::19] = 0, 0, np.inf, -np.inf, np.nan
  with np.errstate(all="ignore"):
    expect = (a.astype(np.float64) / b).astype(np.float32)
  _same_bits(jax.jit(div_rn)(a, b), expect)
  # s_dec = 1 / s_enc of TE's NVFP4 tensor scale at the bottom of the range: subnormal, correctly rounded
  s_enc = np.array([2.0**127, 3e38, np.finfo(np.float32).max, 2688 / 1e-36], np.float32)
  _same_bits(div_rn(jnp.float32(1.0), jnp.asarray(s_enc)), (1.0 / s_enc.astype(np.float64)).astype(np.float32))


@pytest.mark.parametrize("num", [1, 3])
def test_mul_pow2_rn_is_ieee_with_subnormals(num):
  rng = np.random.RandomState(3)
  x = _f32_with_subnormals(rng, 100_000)
  x[::23], x[::29] = 0.0, np.inf
  k = rng.randint(-160, 160, x.size).astype(np.int32)
  with np.errstate(all="ignore"):
    expect = (x.astype(np.float64) * num * np.exp2(k.astype(np.float64))).astype(np.float32)
  _same_bits(jax.jit(lambda a, e: mul_pow2_rn(a, e, num))(x, k), expect)


def test_mul_rn_is_one_ieee_rounding_of_the_exact_scaled_product():
  """``mul_rn(a, b, k)`` = fl32(a·b·2^k): NumPy's float64 product of two float32 values is exact (48 significant
  bits), so is its scaling by 2^k (|k| <= 60 keeps it inside float64's range), and the cast rounds it once to float32
  (nearest, ties to even, subnormal results kept). Operands span subnormals to near FLT_MAX; Inf, NaN, zeros."""
  rng = np.random.RandomState(7)
  n = 100_000
  a, b = _f32_with_subnormals(rng, n), _f32_with_subnormals(rng, n)
  a[::17], b[::19], a[::37], b[::41] = 0.0, np.inf, np.nan, -0.0
  k = rng.randint(-60, 61, n).astype(np.int32)
  with np.errstate(all="ignore"):
    expect = (a.astype(np.float64) * b * np.exp2(k.astype(np.float64))).astype(np.float32)
  _same_bits(jax.jit(mul_rn)(a, b, k), expect)
  with np.errstate(all="ignore"):
    plain = (a.astype(np.float64) * b).astype(np.float32)
  _same_bits(jax.jit(mul_rn)(a, b), plain)  # k defaults to 0


def test_mul_short_rn_is_ieee_with_subnormals():
  rng = np.random.RandomState(4)
  n = 100_000
  a = (rng.randint(-127, 128, n) * np.exp2(rng.randint(-160, 100, n).astype(np.float64))).astype(np.float32)
  b = _f32_with_subnormals(rng, n)
  a[::13], b[::7], b[::31] = np.inf, 0.0, np.nan
  with np.errstate(all="ignore"):
    expect = (a.astype(np.float64) * b).astype(np.float32)
  _same_bits(jax.jit(mul_short_rn)(a, b), expect)


def test_round_pack_of_short_integers_is_exact_and_ties_go_to_even():
  """``round_pack`` accepts any ``p`` below 2^31: short ``p`` (fewer than 24 bits) is shifted left, exactly; values
  below the subnormal grid round to nearest, ties to the even neighbour (NumPy's float64 -> float32 cast)."""
  from fp4jax._src.ieee import round_pack

  p = np.array([1, 2, 3, 5, 7, 255, (1 << 23) - 1, 1 << 23, (1 << 24) + 1, (1 << 30) + 3, 12345, 3, 5, 7, 6], np.uint32)
  lsb = np.array([0, -3, 7, -140, 100, -20, -149, -160, -170, -180, -160, -150, -150, -151, -151], np.int32)
  sign = (np.arange(p.size) % 2).astype(np.uint32)
  expect = (np.where(sign == 1, -1.0, 1.0) * p.astype(np.float64) * np.exp2(lsb.astype(np.float64))).astype(np.float32)
  _same_bits(round_pack(jnp.asarray(sign), jnp.asarray(p), jnp.asarray(lsb)), expect)


def test_mul_pow2_rn_multiplies_by_one_power_of_two_by_default():
  x = np.array([1.5, -3.0, 1e-40, 7.0], np.float32)
  k = np.array([3, -2, 10, 0], np.int32)
  _same_bits(mul_pow2_rn(jnp.asarray(x), jnp.asarray(k)), (x.astype(np.float64) * np.exp2(k)).astype(np.float32))


def test_mul_pow2_rn_f32_is_the_ieee_product_over_its_exponent_range():
  """``x · 2^k`` for every ``k`` in [-149, 127] (2^k a float32, subnormal below -126): the NumPy float64 product
  (exact) rounded once to float32 with gradual underflow, bit for bit; normal, subnormal and special ``x``."""
  rng = np.random.default_rng(3)
  k = np.arange(-149, 128, dtype=np.int32).repeat(8)
  x = rng.integers(0, 2**32, k.size, dtype=np.uint64).astype(np.uint32).view(np.float32).copy()
  x[::8] = np.float32(1.0) + np.float32(2**-23) * rng.integers(0, 2**23, x[::8].size)  # the full significand
  x[1::8] = np.float32(2**-149) * rng.integers(1, 2**23, x[1::8].size)  # subnormal x
  x[:3] = np.float32([np.inf, -0.0, np.nan])
  with np.errstate(all="ignore"):
    expect = (x.astype(np.float64) * np.exp2(k.astype(np.float64))).astype(np.float32)
  _same_bits(mul_pow2_rn_f32(jnp.asarray(x), jnp.asarray(k)), expect)


def test_mul_unflushed_is_the_ieee_product_with_subnormals():
  """The IEEE product (NumPy float64 product rounded once to float32, gradual underflow) bit for bit: subnormal
  or negative ``x`` that a flushing backend (XLA on CPU) would count as 0, and subnormal products, whose sign
  decides an E2M1 zero code's (0x8 for a negative subnormal, 0x0 for -0)."""
  from fp4jax._src.ieee import mul_unflushed

  rng = np.random.RandomState(5)
  n = 50_000
  x = _f32_with_subnormals(rng, n, -149, 20)
  y = _f32_with_subnormals(rng, n, -20, 127)
  x[:4], y[:4] = [1e-45, -1e-45, -3e-39, 5e-39], [2.0**127, 2.0**126, -(2.0**100), -3.0 * 2.0**110]
  x[4:7], y[4:7] = [-(2.0**-42), -(2.0**-42), -0.0], [2.0**-108, 2.0**-107, 3.0]  # a tie at 2^-150 -> -0; -2^-149
  with np.errstate(over="ignore"):
    expect = (x.astype(np.float64) * y).astype(np.float32)
  tiny = np.abs(expect) < np.finfo(np.float32).tiny
  assert np.sum(~tiny & (np.abs(x) < np.finfo(np.float32).tiny) & (x < 0)) > 1000  # negative subnormal x covered
  assert np.sum(tiny & (expect < 0)) > 500 and np.sum(tiny & (expect == 0) & np.signbit(expect)) > 200
  _same_bits(np.asarray(jax.jit(mul_unflushed)(x, y)), expect)
  np.testing.assert_array_equal(
    np.asarray(mul_unflushed(x[4:7], y[4:7])).view(np.uint32), [0x80000000, 0x80000001, 0x80000000]
  )


def test_exact_subnormal_quotients_halfway_between_two_subnormals_round_to_even():
  """a / b exact in binary and exactly halfway between two float32 subnormals: the rounding has no sticky bit, so it
  goes to the even neighbour (NumPy: float64 quotient exact, cast once)."""
  odd = np.arange(1, 2001, 2, dtype=np.float64)
  a = (np.concatenate([odd, 3 * odd]) * 2.0**-100).astype(np.float32)
  b = np.concatenate([np.full(odd.size, 2.0**50), np.full(odd.size, 3 * 2.0**50)]).astype(np.float32)
  expect = (a.astype(np.float64) / b).astype(np.float32)
  assert np.all(expect.astype(np.float64) != a.astype(np.float64) / b)  # every case rounds (a tie)
  _same_bits(jax.jit(div_rn)(a, b), expect)


def test_correction_of_exact_significand_quotients_from_guesses_two_off():
  """Remainder 0 (N a multiple of mb): guesses one or two above or below still give R = 0, not R = mb."""
  from fp4jax._src.ieee import floor_significand_quotient

  mb = np.array([1 << 23, 3 << 22, 5 << 21, (1 << 24) - 1, 7 << 21], np.uint64)
  ma = np.array([1 << 23, 3 << 22, 15 << 20, (1 << 24) - 1, 21 << 20], np.uint64)
  n = np.where(ma < mb, ma << 24, ma << 23)
  assert np.all(n % mb == 0)
  for off in (-2, -1, 0, 1, 2):
    q, r = floor_significand_quotient(
      jnp.asarray(ma, jnp.uint32),
      jnp.asarray(mb, jnp.uint32),
      jnp.asarray((n // mb).astype(np.int64) + off, jnp.uint32),
    )
    np.testing.assert_array_equal(np.asarray(q), (n // mb).astype(np.uint32))
    np.testing.assert_array_equal(np.asarray(r), np.zeros(mb.size, np.int32))


def test_rescaled_product_is_the_ieee_product_where_it_is_normal():
  """``_rescaled_product`` (``mul_unflushed`` on CUDA and ROCm) against NumPy's float64 product rounded once to
  float32, on the CPU: random normal products (both signs, the whole exponent range) and subnormal ``x`` whose
  product is normal, which a flushing multiply would count as 0 (the rescaling ``x · 2^64``, ``y · 2^-64`` is
  exact). Subnormal results are the backend's (flushed here), so none is included."""
  rng = np.random.RandomState(9)
  n = 50_000
  x = _f32_with_subnormals(rng, n, -149, 60)
  y = np.where(np.abs(x) < np.finfo(np.float32).tiny, 2.0 ** rng.uniform(60, 127, n), 2.0 ** rng.uniform(-60, 80, n))
  y = (y * rng.choice([-1.0, 1.0], n)).astype(np.float32)
  with np.errstate(over="ignore"):
    expect = (x.astype(np.float64) * y).astype(np.float32)
  keep = np.abs(expect) >= np.finfo(np.float32).tiny
  x, y, expect = x[keep], y[keep], expect[keep]
  assert np.sum(np.abs(x) < np.finfo(np.float32).tiny) > 1000  # subnormal x with normal products
  assert np.sum(np.isinf(expect)) > 10 and np.sum(np.abs(expect) < 2.0**-100) > 1000  # overflow and small normals
  _same_bits(np.asarray(jax.jit(ieee._rescaled_product)(x, y)), expect)


@pytest.mark.parametrize("platform, integer", [("cpu", True), ("cuda", False), ("rocm", False), ("tpu", True)])
def test_mul_unflushed_takes_the_float_product_only_on_gpus(platform, integer):
  """``mul_unflushed`` lowered for each platform: the float product (``_rescaled_product``, no integer multiply) on
  CUDA and ROCm, whose fp32 multiply keeps subnormal results; ``mul_rn`` (the exact product in uint32 limbs)
  elsewhere."""
  x = jnp.ones((4,), jnp.float32)
  text = ieee.mul_unflushed.trace(x, x).lower(lowering_platforms=(platform,)).as_text()
  assert bool(re.search(r"stablehlo\.multiply .*tensor<4xui32>", text)) == integer


@pytest.mark.parametrize("platform, float64", [("cpu", False), ("cuda", True), ("rocm", False), ("tpu", False)])
def test_div_rn_divides_in_float64_only_on_cuda(platform, float64):
  """``div_rn`` lowered for each platform: on CUDA one float64 division and no integer work (no leading-zero count,
  no uint32 arithmetic); elsewhere the integer path, with no float64 in the program."""
  x = jnp.ones((4,), jnp.float32)
  text = div_rn.trace(x, x).lower(lowering_platforms=(platform,)).as_text()
  assert bool(re.search(r"stablehlo\.divide .*tensor<4xf64>", text)) == float64
  assert ("count_leading_zeros" in text) != float64
  assert ("f64" in text) == float64


def _rn32(q: Fraction) -> float:
  """The float32 nearest to the exact rational ``q > 0`` (ties to even), subnormals included, by integer arithmetic
  on the exact value: q = n · 2^e with 2^23 <= n < 2^24 (e >= -149)."""
  e = max(q.numerator.bit_length() - q.denominator.bit_length() - 24, -149)
  while q / Fraction(2) ** e >= 2**24:
    e += 1
  while e > -149 and q / Fraction(2) ** e < 2**23:
    e -= 1
  scaled = q / Fraction(2) ** e
  n, rem = divmod(scaled.numerator, scaled.denominator)
  if 2 * rem > scaled.denominator or (2 * rem == scaled.denominator and n % 2):
    n += 1
  return float(Fraction(n) * Fraction(2) ** e)


def _near_midpoints(rng, count: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
  """Operands whose quotient lies within a few float32 ulps of a midpoint between two float32 values: a = fl(m·b)
  for a random midpoint m, the hard cases for a double rounding."""
  q = (rng.uniform(1, 2, count) * np.exp2(rng.randint(lo, hi, count))).astype(np.float32)
  m = q.astype(np.float64) + np.spacing(q).astype(np.float64) / 2
  b = (rng.uniform(1, 2, count) * np.exp2(rng.randint(-20, 20, count))).astype(np.float32)
  return (m * b).astype(np.float32), b


def test_float64_quotient_rounded_to_float32_is_the_exact_quotient_correctly_rounded():
  """``_div_float64`` (``div_rn`` on CUDA GPUs) against an exact rational oracle on quotients within a few ulps of a
  float32 midpoint (where a second rounding could go wrong) and on random ones. On the CPU, whose XLA flushes
  float32 subnormals, for normal operands and quotients; with NumPy's own float64 division (which does not flush) for
  subnormal quotients too, the same formula, so that the double rounding is checked across gradual underflow."""
  rng = np.random.RandomState(7)
  a, b = _near_midpoints(rng, 3000, -60, 60)
  a2 = (rng.randn(2000) * np.exp2(rng.uniform(-60, 60, 2000))).astype(np.float32)
  b2 = (rng.randn(2000) * np.exp2(rng.uniform(-60, 60, 2000))).astype(np.float32)
  a, b = np.concatenate([a, a2]), np.concatenate([b, b2])
  want = np.float32([np.sign(x / y) * _rn32(abs(Fraction(float(x)) / Fraction(float(y)))) for x, y in zip(a, b)])
  got = np.asarray(jax.jit(ieee._div_float64)(a, b))
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  np.testing.assert_array_equal(np.asarray(jax.jit(div_rn)(a, b)).view(np.uint32), want.view(np.uint32))
  # subnormal quotients: the same formula in NumPy against the oracle
  m = (rng.randint(1, 1 << 23, 3000) + 0.5) * 2.0**-149  # midpoints between two subnormal float32 values
  b = (rng.uniform(1, 2, 3000) * np.exp2(rng.randint(30, 100, 3000))).astype(np.float32)
  a = (m * b).astype(np.float32)  # a normal float32: a / b = m (1 + δ), |δ| <= 2^-24, far less than half an ulp
  want = np.float32([np.sign(x / y) * _rn32(abs(Fraction(float(x)) / Fraction(float(y)))) for x, y in zip(a, b)])
  np.testing.assert_array_equal((a.astype(np.float64) / b).astype(np.float32).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("jit", [False, True])
def test_widen_is_exact_on_every_bit_pattern(dtype, jit):
  """``ieee.widen`` gives NumPy's exact float32 value of each of the 2^16 bfloat16 / float16 bit patterns
  (subnormals, zeros of both signs, infinities; NaNs stay NaN)."""
  x = np.arange(1 << 16, dtype=np.uint16).view(dtype)
  want = x.astype(np.float32)
  nan = np.isnan(want)
  got = np.asarray((jax.jit(ieee.widen) if jit else ieee.widen)(jnp.asarray(x)))
  assert got.dtype == np.float32
  np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
  assert np.isnan(got[nan]).all()


def test_widen_converts_other_dtypes_and_uses_no_float_conversion_for_bfloat16():
  """float32 passes unchanged and float64 rounds like ``astype``; a bfloat16 operand lowers to bit casts and a
  shift, no float conversion that XLA:GPU's excess-precision pass could fold into a producer (the effect itself is
  checked on a GPU by ``tests/test_gpu_parity.py``)."""
  f32 = np.float32([1.5, -0.0, 3e-45, np.inf])
  assert np.asarray(ieee.widen(jnp.asarray(f32))).view(np.uint32).tolist() == f32.view(np.uint32).tolist()
  text = str(jax.make_jaxpr(ieee.widen)(jnp.zeros(4, jnp.bfloat16)))
  assert (
    "bitcast_convert_type" in text and "shift_left" in text and "convert_element_type[new_dtype=float32" not in text
  )


# ------------------------------------------------------------------------------------------------ the CPU float path
def _ieee(name, a, b):
  """The IEEE float32 product, subnormals kept (the oracle): the exact float64 product rounded once to float32;
  ``b`` is k for mul_pow2_rn_f32."""
  a64 = a.astype(np.float64)
  with np.errstate(over="ignore", under="ignore", invalid="ignore"):
    if name == "mul_pow2_rn_f32":
      return (a64 * np.exp2(b.astype(np.float64))).astype(np.float32)
    return (a64 * b).astype(np.float32)


def _operands(name, n, rng, lo, hi):
  """Random operands whose results lie in [2^lo, 2^hi) in magnitude (about), both signs; mul_short_rn's first factor
  an E2M1 value times a power of two (at most 7 significant bits, its contract)."""
  if name == "mul_short_rn":
    a = rng.choice(np.float32([0.5, 1, 1.5, 2, 3, 4, 6]), n) * np.exp2(rng.randint(-3, 4, n)).astype(np.float32)
  else:
    a = (rng.uniform(1, 2, n) * np.exp2(rng.randint(lo // 2, hi // 2, n))).astype(np.float32)
  a = np.where(rng.rand(n) < 0.5, -a, a).astype(np.float32)
  if name == "mul_pow2_rn_f32":
    return a, rng.randint(max(lo // 2, -126), min(hi // 2, 127), n).astype(np.int32)
  b = (rng.uniform(1, 2, n) * np.exp2(rng.randint(lo // 2, hi // 2, n))).astype(np.float32)
  return a, b


OPS = {
  "mul_short_rn": (ieee.mul_short_rn, ieee._product_safe),
  "mul_unflushed": (ieee.mul_unflushed, ieee._product_safe),
  "mul_pow2_rn_f32": (ieee.mul_pow2_rn_f32, ieee._mul_pow2_safe),
}


@pytest.mark.parametrize("name", list(OPS))
def test_cpu_float_path_gives_the_ieee_bits_where_nothing_is_subnormal(name):
  """A tensor whose operands and results are all normal (or zero) takes XLA:CPU's float product (the predicate holds for
  every element) and gives the oracle's bits, zeros and signs included."""
  fn, safe = OPS[name]
  a, b = _operands(name, 100_000, np.random.RandomState(1), -100, 100)
  a[:3] = [0.0, -0.0, 0.0]  # zero operands: signed zero results
  b[3] = 0 if name == "mul_pow2_rn_f32" else -0.0
  r = fn(jnp.asarray(a), jnp.asarray(b))
  assert bool(jnp.all(safe(jnp.asarray(a), jnp.asarray(b), r)))
  np.testing.assert_array_equal(np.asarray(r).view(np.uint32), _ieee(name, a, b).view(np.uint32))


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("where", ["result", "operand", "edge"])
def test_one_subnormal_sends_the_whole_tensor_to_the_integer_path(name, where):
  """One element with a subnormal result (XLA:CPU would flush it to zero), a subnormal operand (read as zero), or a
  result just below 2^-125 (near the normal boundary): the predicate fails for the tensor and the integer path gives
  every element the oracle's bits, that one included (a float path for it would give 0)."""
  fn, safe = OPS[name]
  a, b = _operands(name, 4096, np.random.RandomState(2), -40, 40)
  tiny = np.float32(2.0**-140 * 1.375)
  if where == "operand" and name != "mul_short_rn":
    a[7] = tiny  # a subnormal operand
  elif name == "mul_pow2_rn_f32":
    a[7], b[7] = np.float32(1.375), -140 if where == "result" else -126
  else:  # 1.5·2^-126 (normal, below 2^-125), or 1.5·2^-140 (subnormal)
    a[7], b[7] = np.float32(1.5), np.float32(2.0**-126 if where == "edge" else 2.0**-140)
  r = fn(jnp.asarray(a), jnp.asarray(b))
  assert not bool(jnp.all(safe(jnp.asarray(a), jnp.asarray(b), lax_mul(name, a, b))))
  expect = _ieee(name, a, b)
  assert expect[7] != 0
  np.testing.assert_array_equal(np.asarray(r).view(np.uint32), expect.view(np.uint32))


def lax_mul(name, a, b):
  """XLA:CPU's float product itself (flushing), the result the predicate judges."""
  a, b = jnp.asarray(a), jnp.asarray(b)
  if name == "mul_pow2_rn_f32":
    return jax.jit(ieee._mul_pow2_float)(a, b)
  return jax.jit(jax.lax.mul)(a, b)
