"""Independent NumPy oracles for the formats: ml_dtypes casts (round-to-nearest-even in C, outside XLA).

``nvfp4_reference`` follows Transformer Engine's reference quantizer step by step in float32.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = np.finfo(np.float32).max


def e2m1_codes(v: np.ndarray) -> np.ndarray:
  """RNE E2M1 codes of float32 ``v`` (already clamped to ±6); exact -0.0 and x >= 0 give a clear sign bit."""
  c = np.asarray(v, F32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
  return np.where(v >= 0, c & 0x7, c).astype(np.uint8)


def e2m1_values(codes: np.ndarray) -> np.ndarray:
  mag = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], F32)[codes & 7]
  return np.where(codes & 8, -mag, mag).astype(F32)


def e4m3(x: np.ndarray) -> np.ndarray:
  with np.errstate(invalid="ignore"):  # NaN casts to E4M3's NaN, as meant; numpy flags every NaN cast
    return np.asarray(x, F32).astype(ml_dtypes.float8_e4m3fn).astype(F32)


def nvfp4_reference(x: np.ndarray, numerator: float = 2688.0, target: float = 6.0):
  """TE-order NVFP4 1x16 along the last axis of a 2D float32 array (length a multiple of 16), every step NumPy
  float32 (IEEE, subnormals kept: NumPy does not flush). ``numerator`` / ``target``: the tensor-scale numerator
  (6·448) and the block target (6); four-over-six uses 6·256 and 6 or 4.

  Returns (codes, dec (per block, fp32), s_dec, dequantized).
  """
  x = np.asarray(x, F32)
  with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
    amax = F32(np.max(np.abs(x)))
    s_enc = F32(1.0) if amax == 0 else np.minimum(F32(numerator) / amax, F32(FLT_MAX))
    s_dec = F32(1.0) / s_enc
    xb = x.reshape(x.shape[0], -1, 16)
    amax_b = np.max(np.abs(xb), axis=-1, keepdims=True)
    dec = e4m3(np.clip(amax_b * (s_enc * F32(1.0 / target)), -448, 448))
    enc = np.minimum(F32(1.0) / (dec * s_dec), F32(FLT_MAX)).astype(F32)
    v = np.clip(xb * enc, -6, 6).astype(F32)
    codes = e2m1_codes(v)
    deq = ((e2m1_values(codes) * dec).astype(F32) * s_dec).astype(F32)
  return codes.reshape(x.shape), dec[..., 0], s_dec, deq.reshape(x.shape)


# ------------------------------------------------------------------------------------------------ exact float64
# float64 holds every product below exactly (at most 26 + 24 significant bits, exponents far inside its range), and
# NumPy's float64 -> float32 cast rounds once to nearest-even with gradual underflow: IEEE fp32 with subnormals.
E2M1_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)
QUEST_RATIO = F32(2.92247856 / 6.0)


def floor_log2(a: np.ndarray) -> np.ndarray:
  """Exact floor(log2 a) for finite a > 0 (subnormal float32 values too), from frexp; -150 for 0."""
  a = np.asarray(a, np.float64)
  _, e = np.frexp(a)
  return np.where(a > 0, e - 1, -150).astype(np.int64)


def pairwise_sum_f32(v: np.ndarray) -> np.ndarray:
  """float32 sum over the last axis (power-of-two length) by the tree ``v[2i] + v[2i+1]``, keep-dims."""
  v = np.asarray(v, F32)
  while v.shape[-1] > 1:
    v = (v[..., 0::2] + v[..., 1::2]).astype(F32)
  return v


def _is_negative(x: np.ndarray) -> np.ndarray:
  """TE's sign rule: x < 0 (-0.0 and NaN are not negative)."""
  with np.errstate(invalid="ignore"):
    return np.asarray(x) < 0


def e2m1_rtn_codes(v: np.ndarray, negative: np.ndarray) -> np.ndarray:
  """RNE E2M1 codes of the magnitudes of float32 ``v``, saturating at 6 (Inf/NaN too); sign from ``negative``."""
  a = np.abs(np.asarray(v, np.float64))
  a = np.where(np.isnan(a) | (a > 6), 6.0, a)
  c = a.astype(F32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x7
  return (c | np.where(negative, 8, 0)).astype(np.uint8)


def e2m1_sr_codes(v: np.ndarray, negative: np.ndarray, bits: np.ndarray) -> np.ndarray:
  """Stochastic E2M1 codes: with lo <= a = min(|v|, 6) < hi the grid neighbours, up iff (bits >> 8)·2^-24 <
  (a - lo)/(hi - lo) (exact in float64); a < 2^-126 (subnormal) rounds to 0."""
  a = np.abs(np.asarray(v, np.float64))
  a = np.where(np.isnan(a) | (a > 6), 6.0, a)
  a = np.where(a < 2.0**-126, 0.0, a)
  lo = np.searchsorted(E2M1_GRID, a, side="right") - 1
  hi = np.minimum(lo + 1, 7)
  frac = np.where(lo == 7, 0.0, (a - E2M1_GRID[lo]) / (E2M1_GRID[hi] - E2M1_GRID[lo]))
  u = (np.asarray(bits, np.uint32) >> 8).astype(np.float64) * 2.0**-24
  c = np.where(u < frac, hi, lo)
  return (c | np.where(negative, 8, 0)).astype(np.uint8)


def mx_exponents(amax_b: np.ndarray, mode: str, sigma: np.ndarray | None = None) -> np.ndarray:
  """E8M0 exponents per block (see fp4jax.scaling), each from its definition in exact float64."""
  a = np.asarray(amax_b, np.float64)
  if mode in ("floor", "floor_headroom"):
    e = floor_log2(a) - 2
  elif mode == "rceil":  # the smallest e with 6·2^e >= amax_b
    e = floor_log2(a) - 3
    for _ in range(3):
      e = np.where(6.0 * np.exp2(e.astype(np.float64)) >= a, e, e + 1)
  else:
    target = (QUEST_RATIO * np.asarray(sigma, F32)).astype(F32) + F32(1e-8)
    e = floor_log2(target)
    if mode == "quest_nearest":
      e = e + (target.astype(np.float64) >= F32(np.sqrt(2.0)) * np.exp2(e.astype(np.float64)))
  return np.where(a == 0, -127, np.clip(e, -127, 127)).astype(np.int64)


def block_std_f32(xb: np.ndarray, count: int) -> np.ndarray:
  """sqrt(max(E[x²] - E[x]², 0)) per block, float32, sums pairwise, divisions correctly rounded; a block with
  max|x| >= 2^60 computed on x · 2^-80, its σ times 2^80 (its x² would overflow float32)."""
  with np.errstate(invalid="ignore"):
    big = np.max(np.abs(xb), axis=-1, keepdims=True) >= 2.0**60
  xb = np.where(big, xb * F32(2.0**-80), xb).astype(F32)
  mean = (pairwise_sum_f32(xb).astype(np.float64) / count).astype(F32)
  mean_sq = (pairwise_sum_f32((xb * xb).astype(F32)).astype(np.float64) / count).astype(F32)
  sigma = np.sqrt(np.maximum((mean_sq - (mean * mean).astype(F32)).astype(F32), F32(0)))
  return np.where(big, sigma * F32(2.0**80), sigma).astype(F32)


def mxfp4_reference(x: np.ndarray, mode: str = "floor", rounding: str = "rtn", bits: np.ndarray | None = None):
  """OCP MX v1.0 MXFP4 1x32 along the last axis of a 2D float32 array (length a multiple of 32), IEEE fp32 with
  subnormals: scaled = f32(x · p · 2^-e) rounded once (p = 3/4 for "floor_headroom", else 1), codes by RTN or SR,
  dequantized f32(f32(value · 2^e) · f32(1/p)). Returns (codes, exponents per block, dequantized)."""
  x = np.asarray(x, F32)
  xb = x.reshape(x.shape[0], -1, 32)
  with np.errstate(invalid="ignore", over="ignore"):
    mag = np.abs(xb)
    amax_b = np.max(np.where(np.isnan(mag), np.inf, mag), axis=-1, keepdims=True)
    sigma = block_std_f32(xb, 32) if mode.startswith("quest") else None
    e = mx_exponents(np.where(np.isfinite(amax_b), amax_b, 1.0), mode, sigma)
    pre = 0.75 if mode == "floor_headroom" else 1.0
    scaled = (xb.astype(np.float64) * pre * np.exp2(-e.astype(np.float64))).astype(F32)
    neg = _is_negative(scaled)  # the scaled value's sign: one that underflows to -0 gives code 0 (fp4jax.rounding)
    if rounding == "rtn":
      codes = e2m1_rtn_codes(scaled, neg)
    else:
      codes = e2m1_sr_codes(scaled, neg, np.asarray(bits).reshape(xb.shape))
    v = e2m1_values(codes).astype(np.float64) * np.exp2(e.astype(np.float64))
    g = F32(1.0 / pre)
    deq = (v.astype(F32).astype(np.float64) * np.float64(g)).astype(F32)
    deq = np.where(np.isfinite(amax_b), deq, np.nan).astype(F32)
  return codes.reshape(x.shape), e[..., 0], deq.reshape(x.shape)


def four_over_six_error(x: np.ndarray, deq: np.ndarray, amax_b: np.ndarray) -> np.ndarray:
  """The four-over-six block error (fp4jax.quantize's module docstring) for blocks on the last axis, keep-dims."""
  d = (np.asarray(x, F32) - np.asarray(deq, F32)).astype(F32)
  d = (d.astype(np.float64) * np.exp2(-floor_log2(amax_b).astype(np.float64))).astype(F32)
  d = np.where(np.abs(d) < F32(2.0**-40), F32(0), d).astype(F32)
  hi = (d.view(np.uint32) & np.uint32(0xFFFFF000)).view(F32)
  lo = (d - hi).astype(F32)
  e = ((hi * hi).astype(F32) + (F32(2) * hi * lo).astype(F32)).astype(F32) + (lo * lo).astype(F32)
  return pairwise_sum_f32(e.astype(F32))


def nvfp4_four_over_six_reference(x: np.ndarray):
  """Four-over-six NVFP4 1x16 (numerator 6·256; each block keeps t = 4 iff its error is strictly smaller than
  t = 6's). Returns (codes, dec per block, s_dec, dequantized, use4 per block)."""
  c6, d6, s_dec, q6 = nvfp4_reference(x, numerator=1536.0, target=6.0)
  c4, d4, _, q4 = nvfp4_reference(x, numerator=1536.0, target=4.0)
  xb = np.asarray(x, F32).reshape(x.shape[0], -1, 16)
  amax_b = np.max(np.abs(xb), axis=-1, keepdims=True)
  use4 = four_over_six_error(xb, q4.reshape(xb.shape), amax_b) < four_over_six_error(xb, q6.reshape(xb.shape), amax_b)
  pick = lambda a4, a6, shape: np.where(use4, a4.reshape(xb.shape), a6.reshape(xb.shape)).reshape(shape)
  return (pick(c4, c6, x.shape), np.where(use4[..., 0], d4, d6), s_dec, pick(q4, q6, x.shape), use4[..., 0])


def hadamard_ieee(x: np.ndarray, d: int, signs: np.ndarray | None = None, inverse: bool = False) -> np.ndarray:
  """``fp4jax.hadamard``'s transform of each d-chunk of the last axis in NumPy float32 (IEEE, subnormals kept):
  ``x ⊙ s``, log2(d) butterfly stages pairing element i with i + d/2 into (a + b, a - b) at (2i, 2i + 1), each
  rounded once, then ``· f32(1/sqrt(d))`` rounded once; ``inverse``: the signs after the normalization instead."""
  x = np.asarray(x, F32)
  s = np.ones(d, F32) if signs is None else np.asarray(signs, F32)
  c = x.reshape(*x.shape[:-1], -1, d)
  with np.errstate(over="ignore", invalid="ignore"):
    c = c if inverse else c * s
    for _ in range(int(np.log2(d))):
      a, b = c[..., : d // 2], c[..., d // 2 :]
      c = np.stack([a + b, a - b], axis=-1).reshape(c.shape)
    c = c * F32(1.0 / np.sqrt(d))
  return (c * s if inverse else c).reshape(x.shape)
