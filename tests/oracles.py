"""Independent NumPy oracles for the recipes' quantizers, estimators and GEMMs (no fp4jax import).

Written from FP4-REFERENCE.md and the formulas stated in fp4jax's docstrings: E2M1 round-to-nearest-even on a value
table, E4M3/E5M2 through ml_dtypes' casts (C code outside XLA), every fp32 step of a scale formula as one numpy
float32 operation (correctly rounded, in the documented order), Hadamard transforms as exact float64 products with
the Sylvester matrix followed by the one float32 normalization, and the three GEMMs of a linear layer in float64.

``layer_grads(recipe, x, w, dy)`` is the oracle of ``fp4jax.dot_general``'s forward and backward for a deterministic
recipe (RTN everywhere, fixed Hadamard signs passed in): for dyadic inputs whose Hadamard sums are exact in float32 it
makes every quantization decision the library must make, so its (y, dx, dw) agree to float32 accumulation error.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E4M3_MAX, E5M2_MAX = 448.0, 57344.0
HALF_SMALLEST_SUBNORMAL = 2.0**-150
SMALLEST_NORMAL = 2.0**-126
# signs="fixed" (fp4jax.QuantizeSpec, recipes.deterministic): the Rademacher vector jax.random draws from this seed
FIXED_SIGNS_SEED = 0x5EED5


# ------------------------------------------------------------------------------------------------ test inputs


def subnormal_blocks_tensor() -> np.ndarray:
  """Student-t(3) · 1e-41, every 7th row · 50 (64 x 256 float32): nearly every 16-block's amax is an fp32 subnormal
  (floor(log2 amax_b) < -127), and the larger rows set the tensor scale."""
  a = np.random.RandomState(1).standard_t(3, (64, 256)) * 1e-41
  a[::7] *= 50
  return a.astype(np.float32)


def dyadic(seed, shape, peak) -> np.ndarray:
  """float32 multiples of 1/8 in [-4, 4] (seeded) with ``x[0, 0] = peak``: with peak ±6 NVFP4's tensor scales are
  powers of two and every Hadamard sum of them is exact in float32."""
  rng = np.random.default_rng(seed)
  x = rng.integers(-32, 33, shape) / 8.0
  x[0, 0] = peak
  return x.astype(np.float32)


def fixed_signs(d: int) -> np.ndarray:
  """The ``d`` fixed Hadamard signs (``signs="fixed"``) in float64: the Rademacher draw of ``FIXED_SIGNS_SEED``."""
  return np.asarray(jax.random.rademacher(jax.random.key(FIXED_SIGNS_SEED), (d,), np.float32), np.float64)


def assert_close(got, want, what: str) -> None:
  """float32 accumulation of exact products against a float64 oracle: rtol 1e-5 and atol 1e-5 of the largest
  ``|want|`` (which must be nonzero, else the comparison says nothing)."""
  scale = np.max(np.abs(want))
  assert scale > 0, what
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5 * scale, err_msg=what)


# ------------------------------------------------------------------------------------------------ zero-code signs


def negative_exactly(x: np.ndarray, s: np.ndarray) -> np.ndarray:
  """Whether E2M1's code of ``x`` scaled by ``s`` is negative (sign bit 0x8): ``x < 0`` and the exact ``|x| · s``
  exceeds 2^-150, i.e. the float32 product rounded once with gradual underflow (IEEE) is below zero. A product of
  two float32 values has at most 48 significant bits and an exponent far inside float64's range: exact here."""
  product = np.abs(x.astype(np.float64) * s.astype(np.float64))
  return (x < 0) & (product > HALF_SMALLEST_SUBNORMAL)


def nvfp4_enc(dec: np.ndarray, s_dec, shape) -> np.ndarray:
  """TE's per-element encode scale ``enc_b = min(1 / f32(dec_b · s_dec), FLT_MAX)`` in float32 (NumPy: IEEE), each
  16-element block's ``dec`` (last axis) repeated over its elements and cut to ``shape``."""
  with np.errstate(divide="ignore"):
    enc = np.minimum(F32(1.0) / (dec.astype(F32) * F32(s_dec)), FLT_MAX).astype(F32)
  return np.repeat(enc, 16, axis=-1)[..., : shape[-1]].reshape(shape)


# ------------------------------------------------------------------------------------------------ element roundings
def rne_e2m1(v) -> np.ndarray:
  """Values of ``v`` rounded to E2M1 by round-to-nearest, ties to the even code, saturating at ±6 (float64 out)."""
  v = np.asarray(v, np.float64)
  a = np.minimum(np.abs(v), 6.0)
  dist = np.abs(a[..., None] - E2M1_GRID)
  best = dist.min(axis=-1, keepdims=True)
  # one or two (adjacent) nearest codes; a tie keeps the even one
  idx = np.argmax((dist == best) * np.where(np.arange(8) % 2 == 0, 2, 1), axis=-1)
  return np.where(v < 0, -1.0, 1.0) * E2M1_GRID[idx]


def rne_e4m3(x) -> np.ndarray:
  """float32 values of ``x`` (already within ±448) rounded to float8_e4m3fn, nearest-even (ml_dtypes)."""
  return np.asarray(x, F32).astype(ml_dtypes.float8_e4m3fn).astype(F32)


def rne_e5m2(x) -> np.ndarray:
  return np.asarray(x, F32).astype(ml_dtypes.float8_e5m2).astype(F32)


def fl(x) -> np.ndarray:
  return np.asarray(x, F32)


# ------------------------------------------------------------------------------------------------ Hadamard
def sylvester(d: int) -> np.ndarray:
  """Unnormalized Sylvester Hadamard matrix H_d (float64)."""
  h = np.ones((1, 1))
  while h.shape[0] < d:
    h = np.block([[h, h], [h, -h]])
  return h


def rotate_last(x, d: int, signs=None) -> np.ndarray:
  """y = x_chunk · diag(signs) · H_d / sqrt(d) on every d-chunk of the last axis: the sum in float64 (exact for the
  dyadic data of these tests), then rounded to float32 and multiplied by float32(1/sqrt(d)) once."""
  x = np.asarray(x, np.float64)
  s = np.ones(d) if signs is None else np.asarray(signs, np.float64)
  chunks = x.reshape(*x.shape[:-1], -1, d) * s
  exact = chunks @ sylvester(d)
  assert np.array_equal(exact.astype(F32).astype(np.float64), exact), "test data must rotate exactly in float32"
  return (fl(exact) * F32(1.0 / math.sqrt(d))).reshape(x.shape)


def inverse_rotate_last(g, d: int, signs=None) -> np.ndarray:
  """Transpose of ``rotate_last`` in float64: g_chunk · H_d / sqrt(d), then ⊙ signs."""
  g = np.asarray(g, np.float64)
  s = np.ones(d) if signs is None else np.asarray(signs, np.float64)
  chunks = g.reshape(*g.shape[:-1], -1, d) @ sylvester(d) / math.sqrt(d)
  return (chunks * s).reshape(g.shape)


# ------------------------------------------------------------------------------------------------ NVFP4
def nvfp4_block_dec(amax_b, s_enc, target: float = 6.0) -> np.ndarray:
  """TE order: dec_b = rne_e4m3(clamp(amax_b · (s_enc · f32(1/target)), ±448)), every product in float32."""
  ratio = F32(s_enc) * F32(1.0 / target)
  return rne_e4m3(np.clip(fl(amax_b) * ratio, -E4M3_MAX, E4M3_MAX))


def nvfp4_block_dec_old_order(amax_b, s_enc) -> np.ndarray:
  """Older TE order (amax_b / 6) · s_enc: the order the library must NOT use (differs near E4M3 midpoints)."""
  return rne_e4m3(np.clip((fl(amax_b) / F32(6.0)) * F32(s_enc), -E4M3_MAX, E4M3_MAX))


def nvfp4_tensor_scales(amax, numerator: float = 6.0 * 448.0):
  amax = F32(amax)
  with np.errstate(divide="ignore"):
    s_enc = F32(1.0) if amax == 0 else min(F32(numerator) / amax, FLT_MAX)
  return F32(s_enc), F32(1.0) / F32(s_enc)


def _nvfp4_candidate(xb, amax_b, s_enc, s_dec, target):
  """(values q·dec_b as float64, dec_b) of the blocks ``xb`` (..., blocks, elems) under block target ``target``."""
  dec = nvfp4_block_dec(amax_b, s_enc, target)
  with np.errstate(divide="ignore"):
    enc = np.minimum(F32(1.0) / (dec * s_dec), FLT_MAX).astype(F32)
  q = rne_e2m1(np.clip(fl(xb) * enc, -6.0, 6.0))
  return q * dec, dec


def four_over_six_block_error(xb, deq, metric: str = "mse") -> np.ndarray:
  """Per block (last axis, keepdims) error between float32 ``xb`` and its float32 dequantized ``deq``, in float64:
  ``"mse"`` Σ(x − x̂)², ``"l1"`` Σ|x − x̂| (``math.fsum``: the correctly rounded sum), ``"max_abs"`` max|x − x̂|.
  Each difference of two float32 values is exact in float64."""
  d = np.abs(np.asarray(xb, np.float64) - np.asarray(deq, np.float64))
  if metric == "mse":
    return np.sum(np.square(d), -1, keepdims=True)
  if metric == "l1":
    return np.apply_along_axis(math.fsum, -1, d)[..., None]
  assert metric == "max_abs", metric
  return np.max(d, -1, keepdims=True)


def nvfp4(x, *, tiles: bool = False, four_over_six: bool = False, metric: str = "mse"):
  """NVFP4 of a 2D float32 array along its last axis (a multiple of 16; rows a multiple of 16 for ``tiles``).

  Returns ``(values, s_dec, dec)``: the dequantized tensor is ``f32(values) · s_dec`` (``values = q · dec_b``).
  ``four_over_six``: tensor numerator 6·256 and per block the candidate (target 6 or 4) with the smaller error by
  ``metric`` (``four_over_six_block_error`` of x and its dequantized value ``f32(values) · s_dec``); a tie keeps 6
  (Quartet II and the 4/6 paper, the ``fp4jax.quantize`` docstring).
  """
  x = fl(x)
  r, c = x.shape
  if tiles:
    xb = x.reshape(r // 16, 16, c // 16, 16).transpose(0, 2, 1, 3).reshape(r // 16, c // 16, 256)
  else:
    xb = x.reshape(r, c // 16, 16)
  s_enc, s_dec = nvfp4_tensor_scales(np.max(np.abs(x)), 6.0 * (256.0 if four_over_six else 448.0))
  amax_b = np.max(np.abs(xb), axis=-1, keepdims=True)
  vals, dec = _nvfp4_candidate(xb, amax_b, s_enc, s_dec, 6.0)
  if four_over_six:
    vals4, dec4 = _nvfp4_candidate(xb, amax_b, s_enc, s_dec, 4.0)
    err = lambda v: four_over_six_block_error(xb, fl(fl(v) * s_dec), metric)
    use4 = err(vals4) < err(vals)
    vals, dec = np.where(use4, vals4, vals), np.where(use4, dec4, dec)
  if tiles:
    vals = vals.reshape(r // 16, c // 16, 16, 16).transpose(0, 2, 1, 3)
  return vals.reshape(r, c), s_dec, dec[..., 0]


# ------------------------------------------------------------------------------------------------ MXFP4 (Quartet)
def _floor_log2(x) -> np.ndarray:
  return np.floor(np.log2(np.asarray(x, np.float64))).astype(np.int64)


def mxfp4_quest(x):
  """QuEST forward on a 2D array along its last axis (32-blocks): σ_b the block std (float64), scale
  s = 2^floor(log2(0.48708·σ_b + 1e-8)), q = rtn(clamp(x/s, ±6)). Returns (values q·s, 1.0, trust mask |x| < 6s)."""
  x = fl(x)
  xb = x.reshape(x.shape[0], -1, 32).astype(np.float64)
  sigma = np.sqrt(np.maximum(np.mean(xb * xb, -1, keepdims=True) - np.mean(xb, -1, keepdims=True) ** 2, 0.0))
  e = _floor_log2(2.92247856 / 6.0 * sigma + 1e-8)
  s = np.exp2(e.astype(np.float64))
  q = rne_e2m1(np.clip(xb / s, -6, 6))
  return (q * s).reshape(x.shape), 1.0, (np.abs(xb) < 6 * s).reshape(x.shape)


def mxfp4_floor_headroom(x):
  """Quartet backward MXFP4 (3/4 headroom): e = floor(log2 amax_b) − 2, q = rtn(f32(x·0.75)·2^−e).
  Returns (values q·2^e, f32(1/0.75))."""
  x = fl(x)
  xb = x.reshape(x.shape[0], -1, 32)
  amax_b = np.max(np.abs(xb), -1, keepdims=True).astype(np.float64)
  with np.errstate(divide="ignore"):
    e = np.where(amax_b == 0, -127, np.clip(_floor_log2(np.where(amax_b == 0, 1, amax_b)) - 2, -127, 127))
  s = np.exp2(e.astype(np.float64))
  q = rne_e2m1((xb * F32(0.75)).astype(np.float64) / s)
  return (q * s).reshape(x.shape), float(F32(1.0 / 0.75))


# ------------------------------------------------------------------------------------------------ FP8, per-channel E2M1
def fp8(x, fmt: str):
  """Per-tensor current scaling: s = f8_max / amax (fp32), v = rne(clamp(x·s, ±f8_max)); (v, f32(1/s))."""
  x = fl(x)
  fmax, rne = (E4M3_MAX, rne_e4m3) if fmt == "fp8_e4m3" else (E5M2_MAX, rne_e5m2)
  amax = F32(np.max(np.abs(x)))
  s = F32(1.0) if amax == 0 else F32(fmax) / amax
  return rne(np.clip(x * s, -fmax, fmax)).astype(np.float64), float(F32(1.0) / s)


# ------------------------------------------------------------------------------------------------ block-scaled FP8
def _tiles(x, rows: int, cols: int) -> tuple[np.ndarray, tuple[int, ...]]:
  """``x`` (float32, ndim >= 1; 2D tiles need ndim >= 2) zero-padded to whole ``rows`` x ``cols`` tiles of its last
  two dims (``rows=1``: blocks of ``cols`` along the last axis) and reshaped to (..., R, rows, C, cols)."""
  x = fl(x)
  if rows == 1:
    x = x[..., None, :]
  pad = [(0, 0)] * (x.ndim - 2) + [(0, -x.shape[-2] % rows), (0, -x.shape[-1] % cols)]
  p = np.pad(x, pad)
  return p.reshape(*p.shape[:-2], p.shape[-2] // rows, rows, p.shape[-1] // cols, cols), x.shape


def _untile(t: np.ndarray, shape: tuple[int, ...], rows: int) -> np.ndarray:
  out = t.reshape(*t.shape[:-4], t.shape[-4] * t.shape[-3], t.shape[-2] * t.shape[-1])[..., : shape[-2], : shape[-1]]
  return out[..., 0, :] if rows == 1 else out


def _block_amax(t: np.ndarray) -> np.ndarray:
  """Per-tile max|x| (float64, keepdims); NaN for a tile holding NaN, Inf for one holding ±Inf (and no NaN)."""
  return np.max(np.abs(t.astype(np.float64)), axis=(-3, -1), keepdims=True)


def mxfp8(x, scale_mode: str = "floor", block: int = 32):
  """OCP MX v1.0 MXFP8 (E4M3) along the last axis: (values v (float32, E4M3 grid or NaN), E8M0 scale bits (uint8,
  one per block), dequantized float64 v·2^e). Shared exponent e = floor(log2 amax) − 8 ("floor", OCP) or the
  smallest e with 448·2^e >= amax ("rceil"), clipped to [−127, 127], −127 for an all-zero block; elements
  rne_e4m3(clip(x·2^−e, ±448)); a block holding NaN or Inf gets scale 0xFF and NaN elements."""
  t, shape = _tiles(x, 1, block)
  amax = _block_amax(t)
  finite = np.isfinite(amax)
  a = np.where(finite, amax, 1.0)
  _, ex = np.frexp(a)  # a = m·2^ex, m in [0.5, 1): floor(log2 a) = ex − 1 (exact, f32 subnormals too)
  e = ex - 1 - 8
  if scale_mode == "rceil":
    e = e + (a > 448.0 * np.exp2(e.astype(np.float64)))
  e = np.where(a == 0, -127, np.clip(e, -127, 127))
  scaled = np.clip(t.astype(np.float64) * np.exp2(-e.astype(np.float64)), -E4M3_MAX, E4M3_MAX)
  v = np.where(finite, rne_e4m3(scaled.astype(F32)), np.nan).astype(F32)
  bits = np.where(finite, e + 127, 0xFF).astype(np.uint8)[..., 0, 0, :, 0]
  deq = v.astype(np.float64) * np.exp2(e.astype(np.float64))
  return _untile(v, shape, 1), bits, _untile(deq, shape, 1)


def fp8_block(x, block: int = 128, tiles: bool = False):
  """DeepSeek-V3 FP8 block scaling along the last axis, 1 x ``block`` tiles (``tiles``: ``block`` x ``block``
  blocks of the last two dims): (values v (float32), float32 decode scales, dequantized f32(v·s) as float32).
  s = f32(amax / 448) (numpy's correctly rounded float32 division, subnormal quotients kept), 1 for an all-zero
  block, 2^−149 where the quotient underflows to 0; v = rne_e4m3(clip(f32(x / s), ±448)); NaN scale and NaN
  elements for a block holding NaN or Inf."""
  rows = block if tiles else 1
  t, shape = _tiles(x, rows, block)
  amax = _block_amax(t)
  finite = np.isfinite(amax)
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    s = F32(np.where(finite, amax, 0.0)) / F32(448.0)
    s = np.where(s == 0, np.float32(2.0**-149), s)
    s = np.where(amax == 0, F32(1.0), s).astype(F32)
    v = rne_e4m3(np.clip(t / s, -E4M3_MAX, E4M3_MAX))
    v = np.where(finite, v, np.nan).astype(F32)
    s = np.where(finite, s, np.nan).astype(F32)
    deq = (v * s).astype(F32)
  scales = s[..., 0, :, 0]
  scales = scales[..., 0, :] if rows == 1 else scales
  return _untile(v, shape, rows), scales, _untile(deq, shape, rows)


def channel_gamma(x) -> np.ndarray:
  """Per-row E2M1 encode scale γ = f32(6 / max|x_row|) (1 for a zero row), keepdims."""
  amax = np.max(np.abs(fl(x)), -1, keepdims=True)
  return F32(6.0) / np.where(amax == 0, F32(6.0), amax)


def e2m1_channel(x):
  """(values rtn(f32(x·γ)), per-row decode scale f32(1/γ))."""
  g = channel_gamma(x)
  return rne_e2m1(fl(x) * g), (F32(1.0) / g).astype(np.float64)


def occ(x, q: float):
  """Per-row clamp to the order statistics of ranks floor((1−q)·n) and min(floor(q·n), n−1): (x_c, x − x_c)."""
  x = fl(x)
  n = x.shape[-1]
  srt = np.sort(x, axis=-1)
  lo, hi = srt[:, int((1.0 - q) * n)][:, None], srt[:, min(int(q * n), n - 1)][:, None]
  xc = np.clip(x, lo, hi)
  return xc, x - xc


def dge_derivative(x, k: float = 5.0, cap: float = 3.0) -> np.ndarray:
  """Microsoft FP4's DGE f'(x) = (1/k)·|2u/δ − 1|^(1/k − 1), u = |x| − lo local to the E2M1 interval [lo, lo+δ]
  (δ 0.5 below 2, 1 on [2, 4), 2 on [4, 6]; |x| >= 6 in the top interval), capped at ``cap`` (float64)."""
  a = np.minimum(np.abs(np.asarray(x, np.float64)), 6.0)
  delta = np.where(a < 2, 0.5, np.where(a < 4, 1.0, 2.0))
  lo = np.where(a < 2, np.floor(a / 0.5) * 0.5, np.where(a < 4, np.floor(a), 4.0))
  t = np.abs(2 * (a - lo) / delta - 1)
  with np.errstate(divide="ignore"):
    d = np.where(t > 0, (1 / k) * np.where(t > 0, t, 1.0) ** (1 / k - 1), cap)
  return np.minimum(d, cap)


# ------------------------------------------------------------------------------------------------ the layer oracle
@dataclasses.dataclass
class Operand:
  """A quantized operand: dequantized value ``values · scale`` (float64; scale scalar or per row), and an optional
  trust mask (forward operands with estimator "trust_mask")."""

  values: np.ndarray
  scale: np.ndarray | float
  mask: np.ndarray | None = None

  def dequantize32(self) -> np.ndarray:
    """The float32 tensor the library keeps for a backward GEMM: f32(values · scale)."""
    return fl(fl(self.values) * fl(self.scale))


def quantize(x, spec, signs=None) -> Operand:
  """One GEMM operand ``x`` (2D, contraction along the last axis) as ``spec`` (an fp4jax ``OperandSpec``, read as
  data: its fields name the paper's choices) prescribes: OCC, Hadamard, then the format (RTN)."""
  x = fl(x)
  assert spec.rounding == "rtn", "the oracle covers deterministic recipes"
  residual = None
  if spec.clip == "occ":
    x, residual = occ(x, spec.clip_quantile)
  if spec.hadamard:
    x = rotate_last(x, spec.hadamard, signs)
  fmt = None if spec.fmt is None else spec.fmt.name  # the oracle reads the format's name, not its behaviour
  if fmt is None:
    op = Operand(x.astype(np.float64), 1.0)
  elif fmt in ("fp8_e4m3", "fp8_e5m2"):
    op = Operand(*fp8(x, fmt))
  elif fmt == "mxfp8_e4m3":
    op = Operand(mxfp8(x, spec.fmt.scale_mode, spec.fmt.block_size)[2], 1.0)
  elif fmt == "fp8_e4m3_block":
    op = Operand(fp8_block(x, spec.fmt.block_size, tiles=spec.block_shape is not None)[2].astype(np.float64), 1.0)
  elif fmt == "e2m1_channel":
    assert not spec.scale_pow2
    op = Operand(*e2m1_channel(x))
  elif fmt == "nvfp4":
    four_over_six, metric = spec.fmt.scale_mode == "four_over_six", spec.fmt.four_over_six_metric
    vals, s_dec, _ = nvfp4(x, tiles=spec.block_shape == (16, 16), four_over_six=four_over_six, metric=metric)
    op = Operand(vals, float(s_dec))
  elif spec.fmt.scale_mode == "quest":
    vals, g, mask = mxfp4_quest(x)
    op = Operand(vals, g, mask if spec.estimator == "trust_mask" else None)
  else:
    assert spec.fmt.scale_mode == "floor_headroom"
    op = Operand(*mxfp4_floor_headroom(x))
  if residual is not None:
    op = Operand(fl(op.dequantize32() + fl(residual)).astype(np.float64), 1.0, op.mask)
  return op


def gemm(a: Operand, b: Operand) -> np.ndarray:
  """(a.values · b.valuesᵀ) ⊙ (a.scale · b.scaleᵀ) in float64."""
  sa = np.asarray(a.scale, np.float64)
  sb = np.asarray(b.scale, np.float64)
  return (a.values @ b.values.T) * (sa * (sb.T if sb.ndim else sb))


def _backward_source(spec, raw: np.ndarray, forward: Operand) -> np.ndarray:
  """The backward GEMM's W or X (untransposed): the input, or the forward-quantized tensor (float32)."""
  return raw if spec.source == "input" else forward.dequantize32()


def _to_input(grad, fwd_spec, fwd: Operand, signs):
  """Gradient of the forward-quantized operand -> the input's: trust mask in the rotated domain, THEN Hᵀ."""
  if fwd_spec.estimator == "trust_mask":
    grad = np.where(fwd.mask, grad, 0.0)
  if fwd_spec.hadamard:
    grad = inverse_rotate_last(grad, fwd_spec.hadamard, signs)
  return grad


def layer_grads(recipe, x, w, dy, fwd_signs=None, bwd_signs=None):
  """(y, dx, dw) in float64 of ``Y = Q(X)·Q(W)ᵀ`` and its two quantized backward GEMMs as ``recipe`` prescribes.

  X (M, K), W (N, K), dY (M, N). dgrad: dX = Q_N(dY)·Q_N(Wᵀ)ᵀ, wgrad: dW = Q_M(dYᵀ)·Q_M(Xᵀ)ᵀ, each pair rotated by
  the GEMM's Hadamard (``bwd_signs`` for both backward GEMMs, ``fwd_signs`` for the forward; TE's for signs="te");
  W and X re-used from the forward when their ``source`` is "forward" (the gradient then mapped to the input by the
  forward operand's estimator and the inverse forward rotation); DGE multiplies dW by f'(W·γ_W).
  """
  sg = lambda spec, s: (TE_SIGNS_16 if spec.signs == "te" else s) if spec.hadamard else None
  xq = quantize(x, recipe.fwd_lhs, sg(recipe.fwd_lhs, fwd_signs))
  wq = quantize(w, recipe.fwd_rhs, sg(recipe.fwd_rhs, fwd_signs))
  y = gemm(xq, wq)
  a = quantize(dy, recipe.dgrad_lhs, sg(recipe.dgrad_lhs, bwd_signs))
  b = quantize(_backward_source(recipe.dgrad_rhs, w, wq).T, recipe.dgrad_rhs, sg(recipe.dgrad_rhs, bwd_signs))
  dx = gemm(a, b)
  if recipe.dgrad_rhs.source == "forward":
    dx = _to_input(dx, recipe.fwd_lhs, xq, fwd_signs)
  a = quantize(dy.T, recipe.wgrad_lhs, sg(recipe.wgrad_lhs, bwd_signs))
  b = quantize(_backward_source(recipe.wgrad_rhs, x, xq).T, recipe.wgrad_rhs, sg(recipe.wgrad_rhs, bwd_signs))
  dw = gemm(a, b)
  if recipe.wgrad_rhs.source == "forward":
    dw = _to_input(dw, recipe.fwd_rhs, wq, fwd_signs)
  if recipe.fwd_rhs.estimator == "dge":
    spec = recipe.fwd_rhs
    dw = dw * dge_derivative(fl(w) * channel_gamma(w), spec.dge_k, spec.dge_cap)
  return y, dx, dw


# Transformer Engine's fixed 16 signs (FP4-REFERENCE.md §3, bitmask 0xD7E8).
TE_SIGNS_16 = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float64)


# ------------------------------------------------------------------------------------------------ SR decisions
def sr_e2m1_up(a: float, bits: int) -> bool:
  """Stochastic rounding of a magnitude ``a`` in [0, 6) with 32 random ``bits``: up iff (bits >> 8)·2^−24 <
  (a − lo)/(hi − lo), decided exactly (the rounding module's documented rule)."""
  i = np.searchsorted(E2M1_GRID, a, side="right") - 1
  lo, hi = E2M1_GRID[i], E2M1_GRID[i + 1]
  return (bits >> 8) * 2.0**-24 < (a - lo) / (hi - lo)


def e4m3_spacing(x: float) -> float:
  """E4M3 grid spacing at ``x > 0``: 2^(max(floor(log2 x), −6) − 3)."""
  return 2.0 ** (max(math.floor(math.log2(x)), -6) - 3) if x > 0 else 2.0**-9


def sr_e4m3_value(x: float, bits: int) -> float:
  """SR of ``x`` in [0, 448] onto E4M3 with 20 random bits: up iff (bits >> 12)·2^−20 < frac (exact)."""
  step = e4m3_spacing(x)
  s = x / step
  lo = math.floor(s)
  return min((lo + ((bits >> 12) * 2.0**-20 < s - lo)) * step, 448.0)


# ------------------------------------------------------------------------------------------------ MS-EDEN
def pairwise_sum32(x) -> np.ndarray:
  """Sum over the last axis (a power of two) in float32 as the documented tree: x[2i] + x[2i + 1], stage by stage."""
  x = fl(x)
  while x.shape[-1] > 1:
    x = x[..., 0::2] + x[..., 1::2]
  return x[..., 0]


def ms_eden(x, scale_bits):
  """MS-EDEN (Quartet II, no rotation) of a 2D float32 array along its last axis, 16-blocks: tensor numerator
  255.99·V_MAX, block target V_MAX = 6/((17/16)·0.93); v = f32(x·enc_b), q = rtn(v), c = Σv² / Σv·q (float32,
  pairwise; 1 where Σv·q <= 0), s_b' = SR_e4m3(f32(dec_b·c)) with the block's 32 random ``scale_bits`` (a block
  whose dec_b is 0 keeps 0). Returns (dec', s_dec, dequantized float32)."""
  v_max = 6.0 / ((17.0 / 16.0) * 0.93)
  x = fl(x)
  xb = x.reshape(x.shape[0], -1, 16)
  s_enc, s_dec = nvfp4_tensor_scales(np.max(np.abs(x)), 255.99 * v_max)
  amax_b = np.max(np.abs(xb), axis=-1, keepdims=True)
  dec = nvfp4_block_dec(amax_b, s_enc, v_max)
  with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
    enc = np.minimum(F32(1.0) / (dec * s_dec), FLT_MAX).astype(F32)
    v = fl(xb * enc)
    q = rne_e2m1(np.clip(v, -6, 6))
    num, den = pairwise_sum32(v * v), pairwise_sum32(v * fl(q))
    c = np.where(den > 0, num / np.where(den > 0, den, F32(1.0)), F32(1.0)).astype(F32)
  target = fl(dec[..., 0] * c)
  new = np.array(
    [
      sr_e4m3_value(float(t), int(b)) if d > 0 else 0.0
      for t, b, d in zip(target.ravel(), np.asarray(scale_bits).ravel(), dec[..., 0].ravel())
    ],
    F32,
  )
  new = new.reshape(dec.shape[:-1])
  deq = fl(fl(fl(q) * new[..., None]) * s_dec)
  return new, s_dec, deq.reshape(x.shape)


# ------------------------------------------------------------------------------------------------ TE 4over6
def te_four_over_six(x, metric: str = "l1", tiles: bool = False):
  """Transformer Engine's NVFP4 4over6 quantizer (PR #2972 / #3068, ``quantize_4over6_nvfp4.cuh``, default path:
  E4M3 bound 256, error in the input domain) on 2D ``x`` along its last axis, every step one numpy float32 operation
  (subnormals kept): base = (amax_b / 6) · s_enc; dec6 = e4m3(base), dec4 = e4m3(base · 1.5); codes by RTN of
  x · min(1 / (dec · s_dec), FLT_MAX); x̂ = ((q · dec) · amax) / 1536; error terms |x̂ − x| ("l1") or (x̂ − x)²
  ("mse") summed left to right from 0 in float32; 16x16 tiles: the 16 row sums then added as the warp tree
  (r_i + r_{i+8}, then + r_{i+4}, + r_{i+2}, + r_{i+1}). Map-to-4 iff its error is strictly smaller.

  Returns ``(values, dec, s_dec)``: float64 E2M1 values, float32 block scales (one per block, blocks-shaped:
  ``(rows, cols/16)`` or ``(rows/16, cols/16)``), the float32 tensor decode scale; dequantized is
  ``fl(fl(values · dec) · s_dec)``."""
  x = fl(x)
  rows, cols = x.shape
  amax = F32(np.max(np.abs(x)))
  s_enc, s_dec = nvfp4_tensor_scales(amax, 6.0 * 256.0)
  xb = x.reshape(rows // 16, 16, cols // 16, 16) if tiles else x.reshape(rows, cols // 16, 1, 16)
  amax_b = np.max(np.abs(xb), axis=(1, 3) if tiles else (2, 3), keepdims=True)
  with np.errstate(all="ignore"):
    base = fl(fl(amax_b / F32(6.0)) * s_enc)
    best = None
    for dec in (rne_e4m3(np.minimum(base, F32(448.0))), rne_e4m3(np.minimum(fl(base * F32(1.5)), F32(448.0)))):
      enc = np.minimum(F32(1.0) / fl(dec * s_dec), FLT_MAX)
      values = rne_e2m1(fl(xb * enc))
      d = fl(fl(fl(fl(fl(values) * dec) * amax) / F32(1536.0)) - xb)
      terms = np.abs(d) if metric == "l1" else fl(d * d)
      err = np.zeros(terms.shape[:-1], F32)
      for i in range(16):
        err = fl(err + terms[..., i])
      if tiles:  # (rows/16, 16, cols/16): the tree over axis 1
        for half in (8, 4, 2, 1):
          err = fl(err[:, :half] + err[:, half : 2 * half])
      if best is None:
        best = (values, dec, err)
      else:
        pick4 = (err < best[2])[..., None]
        best = (np.where(pick4, values, best[0]), np.where(pick4, dec, best[1]))
  values, dec = best
  values = values.reshape(rows, cols)
  return values, dec.reshape(dec.shape[0], -1), s_dec
