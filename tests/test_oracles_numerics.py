"""Core numerics against the NumPy oracles (tests/oracles.py) on crafted inputs: four-over-six choices and ties,
every stochastic-rounding decision around its threshold, NVFP4 block scales around every E4M3 midpoint (1x16 and
16x16 tiles), and the scaling-law formula at hand-computed points."""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp4jax
from fp4jax._src import eden, rounding, scaling
from tests import numpy_reference, oracles

F32 = np.float32
NVFP4_46 = dataclasses.replace(fp4jax.NVFP4, scale_mode="four_over_six")
RANDOM_SHAPE = (64, 256)  # the four-over-six tests' tensors: their quantizer programs are compiled once


def _quantized(x, fmt, **kw):
  q = fp4jax.quantize(jnp.asarray(x), fmt, hadamard=0, **kw)
  return np.asarray(q.scales.astype(jnp.float32)), np.asarray(
    fp4jax.fake_quantize(jnp.asarray(x), fmt, hadamard=0, dtype=jnp.float32, **kw)
  )


def _oracle_dequantized(vals, s_dec):
  return oracles.fl(oracles.fl(vals) * s_dec)


# ------------------------------------------------------------------------------------------------ four-over-six
def test_four_over_six_picks_each_candidate_and_keeps_6_on_ties():
  """Tensor amax 1536 gives s_enc = s_dec = 1: the block of max 12 has dec 2 (target 6) or 3 (target 4).

  [12, 9]: 9·(1/2) = 4.5 -> 4 -> 8 (error 1) vs 9/3 = 3 -> 9 (error 0): 4 wins.
  [12, 1]: 1/2 -> 1 (exact) vs 1/3 -> 0.5 -> 1.5: 6 wins.
  [12, 6]: both exact (error 0): tie, 6 kept.   [12, 0.5]: 0.25 -> 0 vs 0.1667 -> 0, error 0.25 each: tie, 6 kept.
  """
  blocks = [[1536.0], [12.0, 9.0], [12.0, 1.0], [12.0, 6.0], [12.0, 0.5], [-12.0, -9.0, 3.0], [12.0, -6.0, 0.5]]
  x = np.zeros(RANDOM_SHAPE, F32)  # row 0 holds the blocks; the shape of the random test's, whose programs it shares
  for i, b in enumerate(blocks):
    x[0, 16 * i : 16 * i + len(b)] = b
  scales, deq = _quantized(x, NVFP4_46)
  np.testing.assert_array_equal(scales[0, 1 : len(blocks)], [3.0, 2.0, 2.0, 2.0, 3.0, 2.0])  # by hand, see docstring
  assert not np.any(scales[0, len(blocks) :]) and not np.any(scales[1:])  # the zero blocks
  vals, s_dec, dec = oracles.nvfp4(x, four_over_six=True)
  assert s_dec == 1.0
  np.testing.assert_array_equal(scales, dec)
  np.testing.assert_array_equal(deq, _oracle_dequantized(vals, s_dec))


@pytest.mark.parametrize("seed", [0, 1])
def test_four_over_six_matches_the_oracle_on_random_blocks(seed):
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal(RANDOM_SHAPE) * np.exp2(rng.integers(-4, 5, (64, 1)))).astype(F32)
  x[:, ::7] *= 3.0  # heavier tails: some blocks prefer the map-to-4 scale
  scales, deq = _quantized(x, NVFP4_46)
  vals, s_dec, dec = oracles.nvfp4(x, four_over_six=True)
  np.testing.assert_array_equal(scales, dec)
  np.testing.assert_array_equal(deq, _oracle_dequantized(vals, s_dec))
  # both candidates occur: the map-to-4 scale is 1.5x the map-to-6 one for the same block amax
  s_enc46, _ = oracles.nvfp4_tensor_scales(np.max(np.abs(x)), 1536.0)
  amax_b = np.max(np.abs(x.reshape(64, 16, 16)), -1)
  use4 = dec == oracles.nvfp4_block_dec(amax_b, s_enc46, 4.0)
  assert 0.05 < np.mean(use4) < 0.95, np.mean(use4)


# ------------------------------------------------------------------------------------------------ SR decisions
def _threshold_bits(frac: float, rng) -> list[int]:
  """32-bit words whose (bits >> 8)·2^-24 lies just below, at and just above ``frac``, plus extremes and random."""
  t = int(frac * 2**24)
  us = {max(t - 1, 0), t, min(t + 1, 2**24 - 1), 0, 2**24 - 1, *rng.integers(0, 2**24, 4).tolist()}
  return [(u << 8) | int(rng.integers(0, 256)) for u in sorted(us)]


def _sr_e2m1_cases():
  rng = np.random.default_rng(0)
  grid = oracles.E2M1_GRID
  fracs = [j / 2**22 for j in (1, 2, 3, 5, 7, 255, 256, 257, 4095, 2**21, 2**22 - 1)] + list(rng.random(8))
  xs, bits = [], []
  for lo, hi in itertools.pairwise(grid):
    res = 2.0**-24 if hi <= 1 else 2.0**-22  # fraction bits a float32 magnitude in the gap carries
    for f in fracs:
      a = F32(lo + np.floor(f / res) * res * (hi - lo))
      for b in _threshold_bits(float((a - lo) / (hi - lo)), rng):
        for sign in (1, -1):
          xs.append(sign * a)
          bits.append(b)
  for a in (6.0, 7.5, 1e30, np.inf):  # saturation, whatever the bits
    for b in (0, 1 << 10, 2**32 - 1, int(rng.integers(0, 2**32))):
      for sign in (1, -1):
        xs.append(sign * F32(a))
        bits.append(b)
  return np.array(xs, F32), np.array(bits, np.uint32)


def test_sr_e2m1_every_decision_follows_the_documented_rule():
  """Up iff (bits >> 8)·2^-24 < (|x| − lo)/(hi − lo), exactly, for fractions down to one unit of the gap."""
  xs, bits = _sr_e2m1_cases()
  codes = np.asarray(rounding.sr_e2m1(jnp.asarray(xs), jnp.asarray(bits)))
  got = np.where(codes & 8, -1.0, 1.0) * oracles.E2M1_GRID[codes & 7]
  want = []
  for x, b in zip(xs.astype(np.float64), bits.astype(np.int64)):
    a = min(abs(x), 6.0)
    if a >= 6.0:
      want.append(np.sign(x) * 6.0)
      continue
    i = np.searchsorted(oracles.E2M1_GRID, a, side="right") - 1
    lo, hi = oracles.E2M1_GRID[i], oracles.E2M1_GRID[i + 1]
    want.append(np.sign(x) * (hi if oracles.sr_e2m1_up(a, int(b)) else lo) if a else 0.0)
  bad = np.flatnonzero(got != np.array(want))
  assert bad.size == 0, [(xs[i], hex(bits[i]), got[i], want[i]) for i in bad[:10]]
  assert len(xs) > 1000


def test_sr_e2m1_at_the_smallest_normal_and_below():
  """|x| = 2^-126 rounds up to 0.5 iff (bits >> 8)·2^-24 < 2^-126 / 0.5, i.e. only for u = bits >> 8 = 0, and so
  does its float32 successor; subnormal |x| < 2^-126 rounds to ±0 whatever the bits (the docstring's fixed rule)."""
  tiny = F32(2.0**-126)
  words = [0, 1, 255, 256, 257, 511, 2**31, 2**32 - 1]
  mags = [tiny, np.nextafter(tiny, F32(1))]
  xs = np.array([s * a for a in mags for s in (1, -1) for _ in words], F32)
  bits = np.array(words * (2 * len(mags)), np.uint32)
  codes = np.asarray(rounding.sr_e2m1(jnp.asarray(xs), jnp.asarray(bits)))
  got = np.where(codes & 8, -1.0, 1.0) * oracles.E2M1_GRID[codes & 7]
  want = [np.sign(x) * 0.5 * oracles.sr_e2m1_up(abs(float(x)), int(b)) for x, b in zip(xs, bits)]
  np.testing.assert_array_equal(got, want)
  assert np.count_nonzero(got) == 2 * 2 * 3  # u = 0 for the words 0, 1 and 255: up, for each sign and magnitude
  sub = np.array([2.0**-127, -(2.0**-127), 2.0**-149, np.nextafter(tiny, F32(0))], F32)
  for b in (0, 255, 2**32 - 1):
    codes = np.asarray(rounding.sr_e2m1(jnp.asarray(sub), jnp.full(sub.shape, b, jnp.uint32)))
    np.testing.assert_array_equal(codes & 7, 0)


def test_sr_e4m3_every_decision_follows_the_documented_rule():
  """Up iff (bits >> 12)·2^-20 < s − floor(s) with s = x / spacing, on every E4M3 binade (subnormals too)."""
  rng = np.random.default_rng(1)
  grid = np.arange(0, 0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)  # 0 ... 448
  xs, bits = [], []
  for lo, hi in itertools.pairwise(grid):
    for j in (1, 2, 3, 2**19, 2**20 - 1, *rng.integers(1, 2**20, 3).tolist()):
      x = lo + j * 2.0**-20 * (hi - lo)
      t = j  # threshold in units of 2^-20
      for u in {max(t - 1, 0), t, min(t + 1, 2**20 - 1), 0, 2**20 - 1}:
        xs.append(x)
        bits.append((u << 12) | int(rng.integers(0, 2**12)))
  xs.append(448.0)
  bits.append(2**32 - 1)
  xs, bits = np.array(xs, F32), np.array(bits, np.uint32)
  assert np.array_equal(xs.astype(np.float64), np.array(xs, np.float64))
  got = np.asarray(rounding.sr_e4m3(jnp.asarray(xs), jnp.asarray(bits)), np.float64)
  want = np.array([oracles.sr_e4m3_value(float(x), int(b)) for x, b in zip(xs, bits)])
  bad = np.flatnonzero(got != want)
  assert bad.size == 0, [(xs[i], hex(bits[i]), got[i], want[i]) for i in bad[:10]]


# ------------------------------------------------------------------------------------------------ NVFP4 scales
def _e4m3_midpoints():
  v = np.arange(1, 0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)  # 2^-9 ... 448
  return (v[:-1] + v[1:]) / 2


def _amaxes_around_midpoints(tensor_amax):
  """Block amaxes a with f32(a · (s_enc · f32(1/6))) within ±8 float32 ulp of each E4M3 midpoint."""
  s_enc, _ = oracles.nvfp4_tensor_scales(tensor_amax)
  ratio = F32(s_enc) * F32(1.0 / 6.0)
  out = []
  for m in _e4m3_midpoints():
    a = F32(m / np.float64(ratio))
    for k in range(-8, 9):
      b = a
      for _ in range(abs(k)):
        b = np.nextafter(b, F32(np.inf) if k > 0 else F32(0))
      if 0 < b <= tensor_amax:
        out.append(b)
  return np.array(out, F32)


def _blocks_with_amaxes(amaxes, tensor_amax):
  x = np.zeros((len(amaxes) + 1, 16), F32)
  x[:-1, 0] = amaxes
  x[:-1, 5] = -amaxes * F32(0.37)
  x[:-1, 9] = amaxes * F32(0.81)
  x[-1, 3] = -tensor_amax
  return x


TENSOR_AMAXES = [2688.0, 1000.0, 3.0, 0.0123]


@pytest.mark.parametrize("tensor_amax", TENSOR_AMAXES)
def test_nvfp4_block_scales_in_te_order_around_every_e4m3_midpoint(tensor_amax):
  amaxes = _amaxes_around_midpoints(F32(tensor_amax))
  x = _blocks_with_amaxes(amaxes, F32(tensor_amax))
  scales, deq = _quantized(x, fp4jax.NVFP4)
  vals, s_dec, dec = oracles.nvfp4(x)
  np.testing.assert_array_equal(scales[:, 0], dec[:, 0])
  np.testing.assert_array_equal(deq, _oracle_dequantized(vals, s_dec))


def test_te_order_differs_from_the_old_order_on_the_crafted_blocks():
  """Power check: the crafted amaxes do separate (amax_b·(s_enc·(1/6))) from ((amax_b/6)·s_enc)."""
  differ = 0
  for tensor_amax in TENSOR_AMAXES:
    s_enc, _ = oracles.nvfp4_tensor_scales(F32(tensor_amax))
    a = _amaxes_around_midpoints(F32(tensor_amax))
    differ += np.sum(oracles.nvfp4_block_dec(a, s_enc) != oracles.nvfp4_block_dec_old_order(a, s_enc))
  assert differ >= 10, differ


@pytest.mark.parametrize("tensor_amax", [1000.0, 0.0123])
def test_nvfp4_16x16_tiles_around_every_e4m3_midpoint(tensor_amax):
  amaxes = _amaxes_around_midpoints(F32(tensor_amax))
  cols = 8
  amaxes = np.concatenate([amaxes, amaxes[: (-len(amaxes)) % cols]]).reshape(-1, cols)
  rows = amaxes.shape[0]
  w = np.zeros((16 * rows + 16, 16 * cols), F32)
  rng = np.random.default_rng(0)
  for r in range(rows):
    for c in range(cols):
      i, j = rng.integers(0, 16, 2)
      tile = (rng.random((16, 16)).astype(F32) * F32(0.9)) * amaxes[r, c]
      tile[i, j] = amaxes[r, c] * (1 if (r + c) % 2 else -1)
      w[16 * r : 16 * r + 16, 16 * c : 16 * c + 16] = tile
  w[-1, 0] = tensor_amax
  scales, deq = _quantized(w, fp4jax.NVFP4, block_shape=(16, 16))
  vals, s_dec, dec = oracles.nvfp4(w, tiles=True)
  np.testing.assert_array_equal(scales, dec)
  np.testing.assert_array_equal(deq, _oracle_dequantized(vals, s_dec))


def test_nvfp4_16x16_tiles_on_random_data():
  rng = np.random.default_rng(3)
  w = (rng.standard_normal((96, 160)) * np.exp2(rng.integers(-6, 6, (96, 1)))).astype(F32)
  scales, deq = _quantized(w, fp4jax.NVFP4, block_shape=(16, 16))
  vals, s_dec, dec = oracles.nvfp4(w, tiles=True)
  np.testing.assert_array_equal(scales, dec)
  np.testing.assert_array_equal(deq, _oracle_dequantized(vals, s_dec))


# ------------------------------------------------------------------------------------------------ scaling law
def test_scaling_law_at_hand_computed_points():
  from fp4jax_experiments import scaling_law as sl

  law = sl.LossLaw(A=1.0, alpha=1.0, B=4.0, beta=0.5, E=1.0, gamma=2.0)
  # (1/2 + 4/sqrt(16))^2 + 1 = 1.5^2 + 1 = 3.25; with eff_N = 0.5 at N = 4 and eff_D = 4 at D = 4: the same point
  assert float(law(2.0, 16.0)) == pytest.approx(3.25, rel=1e-6)
  assert float(law(4.0, 4.0, 0.5, 4.0)) == pytest.approx(3.25, rel=1e-6)
  # (10/100 + 9/3)^1 + 0.5 = 3.6 (Chinchilla form, gamma = 1): A/N^α with N = 10^4, α = 0.5
  chin = sl.LossLaw(A=10.0, alpha=0.5, B=9.0, beta=2.0, E=0.5)
  assert float(chin(1e4, np.sqrt(3.0))) == pytest.approx(3.6, rel=1e-6)


def test_published_quartet_law_at_a_point_by_the_formula():
  from fp4jax_experiments import scaling_law as sl

  p = {"A": 1.274e5, "alpha": 0.5785, "B": 4.658e5, "beta": 0.5389, "E": 1.3408, "gamma": 0.2764}  # REFERENCE §4
  n, d, eff_n, eff_d = 100e6, 100e6 * 100, 0.658, 0.822
  want = (p["A"] / (n * eff_n) ** p["alpha"] + p["B"] / (d * eff_d) ** p["beta"]) ** p["gamma"] + p["E"]
  assert float(sl.QUARTET_C4_BF16(n, d, eff_n, eff_d)) == pytest.approx(want, rel=1e-5)
  assert 2.5 < want < 3.5  # a C4 loss of a 100M model


# ------------------------------------------------------------------------------------------------ MXFP4 exponents
def _sigma_for_target(target) -> np.float32:
  """A float32 σ whose QuEST target f32(f32(0.48708·σ) + 1e-8) is exactly ``target``, also when the multiply-add is
  fused (rounded once): a σ near target / 0.48708 (asserted found)."""
  c, eps = numpy_reference.QUEST_RATIO, F32(1e-8)
  sigma = F32(target / c)
  for _ in range(8):
    sigma = np.nextafter(sigma, F32(0))
  for _ in range(16):
    if F32(F32(c * sigma) + eps) == target and F32(float(c) * float(sigma) + float(eps)) == target:
      return sigma
    sigma = np.nextafter(sigma, F32(np.inf))
  raise AssertionError(f"no float32 sigma gives the QuEST target {target!r}")


@pytest.mark.parametrize("k", [10, 0])
def test_quest_nearest_rounds_up_from_exactly_f32_sqrt2(k):
  """``quest_nearest``: e = floor(log2 t) + [t / 2^floor(log2 t) >= f32(sqrt 2)]: up at t = f32(sqrt 2)·2^k itself,
  down one float32 below it."""
  at = F32(np.sqrt(2.0)) * F32(2.0**k)
  below = np.nextafter(at, F32(0))
  sigma = jnp.asarray([_sigma_for_target(at), _sigma_for_target(below)])
  got = np.asarray(scaling.mx_exponents(jnp.ones(2, jnp.float32), "quest_nearest", sigma))
  np.testing.assert_array_equal(got, [k + 1, k])


def test_mx_exponents_clip_to_the_e8m0_range():
  """e in [-127, 127] (E8M0's finite scales 2^-127..2^127; bits 255 are NaN): an infinite QuEST target (σ = Inf)
  clips to 127; FLT_MAX·0.48708 = 1.948·2^126 gives 126 (floor) or 127 (nearest); a finite block never gets the NaN
  scale."""
  sigma = jnp.asarray([np.inf, np.finfo(F32).max], jnp.float32)
  for mode, top in [("quest", 126), ("quest_nearest", 127)]:
    np.testing.assert_array_equal(np.asarray(scaling.mx_exponents(jnp.ones(2, jnp.float32), mode, sigma)), [127, top])
    x = np.where(np.arange(32) % 2, F32(1e20), F32(-1e20)).astype(F32)[None]  # its E[x²] overflows float32
    q = fp4jax.quantize(jnp.asarray(x), dataclasses.replace(fp4jax.MXFP4, scale_mode=mode))
    assert np.asarray(q.scales).view(np.uint8).max() < 255


def test_quest_scales_a_block_whose_squares_overflow():
  """A block of ±1e20 (σ = 1e20): e = floor(log2(0.48708e20)) = 65, the elements ±1e20 / 2^65 ≈ ±2.7 -> ±3."""
  x = np.where(np.arange(32) % 2, F32(1e20), F32(-1e20)).astype(F32)[None]
  q = fp4jax.quantize(jnp.asarray(x), dataclasses.replace(fp4jax.MXFP4, scale_mode="quest"))
  np.testing.assert_array_equal(np.asarray(q.scales).view(np.uint8).astype(int) - 127, [[65]])


# ------------------------------------------------------------------------------------------------ MS-EDEN
def _correction_blocks():
  """(v, codes, c) per 16-element block, c = Σ v² / Σ v·value(q) by hand (1 where that denominator is 0)."""
  blocks = [
    ([0.0] * 16, [0] * 16, 1.0),  # an all-zero block: 0 / 0
    ([0.25, -0.125, 0.0625] + [0.0] * 13, [0, 8, 0] + [0] * 13, 1.0),  # every element rounded to ±0: den = 0 < num
    ([-0.125] * 16, [8] * 16, 1.0),  # v · (-0) = +0: den = 0
    # den = 0.25 + 0.1875 = 0.4375 < 1, num = 0.25 + 0.140625 + 0.0625 + 0.015625 = 0.46875
    ([0.5, 0.375, -0.25, 0.125] + [0.0] * 12, [1, 1, 8, 0] + [0] * 12, 0.46875 / 0.4375),
    # den = 5.5·6 + (-3)·(-3) = 42, num = 30.25 + 9 = 39.25
    ([5.5, -3.0] + [0.0] * 14, [7, 13] + [0] * 14, 39.25 / 42.0),
  ]
  v, codes, c = zip(*blocks)
  return np.array(v, F32), np.array(codes, np.uint8), np.array(c, np.float64).astype(F32)[:, None]


def test_ms_eden_correction_by_hand_including_zero_denominators():
  """Step 5 of MS-EDEN: the sums are exact here, so c is their quotient rounded once to float32."""
  v, codes, want = _correction_blocks()
  np.testing.assert_array_equal(np.asarray(eden.correction(jnp.asarray(v), jnp.asarray(codes), (1,))), want)


def test_ms_eden_correction_of_zero_blocks_divides_no_zero():
  """A zero denominator never reaches the division, not even in the branch ``where`` discards: with
  ``jax_debug_nans`` on, correcting all-zero blocks op by op raises no FloatingPointError (0 / 0 would)."""
  v, codes, want = _correction_blocks()
  with jax.debug_nans(True):
    got = eden.correction(jnp.asarray(v[:3]), jnp.asarray(codes[:3]), (1,))
  np.testing.assert_array_equal(np.asarray(got), want[:3])


@pytest.mark.parametrize("seed", [0, 1])
def test_ms_eden_scales_and_values_equal_the_oracle(seed):
  """MS-EDEN without the rotation (hadamard=0), its scale bits recomputed from the key as ``fp4jax.quantize``
  documents (third split of the key, counter hash over the scale grid): every corrected, stochastically rounded
  E4M3 scale and every value equal the oracle's."""
  import jax

  from fp4jax._src import bits as bits_lib

  rng = np.random.default_rng(seed)
  x = (rng.standard_normal((32, 256)) * np.exp2(rng.integers(-5, 6, (32, 1)))).astype(F32)
  x[3, 16:32] = 0.0  # an all-zero block: c = 1, scale 0
  key = jax.random.key(seed)
  q = fp4jax.quantize(jnp.asarray(x), fp4jax.NVFP4, rounding="eden", key=key, hadamard=0)
  deq = np.asarray(
    fp4jax.fake_quantize(jnp.asarray(x), fp4jax.NVFP4, rounding="eden", key=key, hadamard=0, dtype=jnp.float32)
  )
  scale_bits = np.asarray(bits_lib.random_bits(jax.random.split(key, 3)[2], (32, 16)))
  dec, s_dec, want = oracles.ms_eden(x, scale_bits)
  np.testing.assert_array_equal(np.asarray(q.scales.astype(jnp.float32)), dec)
  np.testing.assert_array_equal(deq, want)
  assert float(q.global_scale) == s_dec


# ------------------------------------------------------------------------------------------------ MXFP4 exponents
def _floor_log2(a):
  return np.frexp(np.asarray(a, np.float64))[1] - 1  # a = m·2^e, m in [0.5, 1): exact


def _mx_exponent_oracle(a, mode, sigma):
  a = np.asarray(a, np.float64)
  if mode in ("floor", "floor_headroom"):
    e = _floor_log2(a) - 2
  elif mode == "rceil":  # the smallest e with 6·2^e >= a, by exact comparison
    e = _floor_log2(a) - 3
    e = np.where(6.0 * np.exp2(e) >= a, e, e + 1)
    e = np.where(6.0 * np.exp2(e) >= a, e, e + 1)
  else:
    t = (F32(2.92247856 / 6.0) * F32(sigma)).astype(F32) + F32(1e-8)
    e = _floor_log2(t)
    if mode == "quest_nearest":  # log-domain nearest: up iff the mantissa t / 2^e >= sqrt 2
      e = e + (t.astype(np.float64) >= np.float64(F32(np.sqrt(2.0))) * np.exp2(e))
  return np.where(a == 0, -127, np.clip(e, -127, 127))


@pytest.mark.parametrize("mode", ["floor", "floor_headroom", "rceil", "quest", "quest_nearest"])
def test_mx_exponents_equal_the_oracle_at_their_boundaries(mode):
  from fp4jax._src import scaling

  rng = np.random.default_rng(5)
  k = rng.integers(-40, 40, 64).astype(np.float64)
  edges = np.concatenate([np.exp2(k), 1.5 * np.exp2(k), np.sqrt(2.0) * np.exp2(k)]).astype(F32)
  near = np.concatenate([edges, np.nextafter(edges, F32(0)), np.nextafter(edges, F32(np.inf))])
  a = np.concatenate([near, (rng.random(256) * np.exp2(rng.integers(-60, 60, 256))).astype(F32), F32([0, 1, 6])])
  sigma = a / F32(2.92247856 / 6.0) if mode.startswith("quest") else None  # puts t at the same edges
  got = np.asarray(scaling.mx_exponents(jnp.asarray(a), mode, None if sigma is None else jnp.asarray(sigma)))
  np.testing.assert_array_equal(got, _mx_exponent_oracle(a, mode, sigma))


def test_e2m1_sign_of_nan_payloads_and_negative_zero():
  """NaN saturates to +6 whatever its sign bit and payload (the sign is set only for x < 0), -0.0 gives code 0."""
  pats = np.array([0x7FC00000, 0xFFC00000, 0xFF800001, 0x7F800001, 0xFFFFFFFF, 0x80000000, 0xBF000000], np.uint32)
  x = jnp.asarray(pats.view(F32))
  rtn = np.asarray(rounding.rtn_e2m1(x))
  sr = np.asarray(rounding.sr_e2m1(x, jnp.zeros(x.shape, jnp.uint32)))
  np.testing.assert_array_equal(rtn, [7, 7, 7, 7, 7, 0, 9])
  np.testing.assert_array_equal(sr, [7, 7, 7, 7, 7, 0, 9])
