"""``quantize`` / ``fake_quantize`` / ``QTensor``: block-scaled FP4 quantization along any axis.

The pipeline, all in fp32 and explicit arithmetic (see ``fp4jax.scaling``, ``fp4jax.rounding``, ``fp4jax.eden``):

    x ─► optional blockwise Hadamard along ``axis`` (bf16 inputs: rounded once to bf16, as TE)
      ─► pad ``axis`` (and, for 2D blocks, the other matrix axis) with zeros to whole blocks
      ─► tensor scale (NVFP4) and block scales ─► E2M1 codes by RTN / SR / MS-EDEN ─► QTensor or dequantized array

Dequantized value of an element: ``f32(value(q) · f32(dec_b)) · s_dec`` (NVFP4, TE order) or
``f32(value(q) · 2^e_b) · g`` (MXFP4, ``g`` = 1, or f32(4/3) for the "floor_headroom" mode), each product rounded
once as IEEE fp32 with subnormals (``fp4jax.ieee.mul_short_rn``: exact integer arithmetic, no backend flushes).

Element scaling: NVFP4 ``x · enc_b`` (the IEEE fp32 product, subnormal inputs and results kept on every backend:
``fp4jax.ieee.mul_unflushed``); MXFP4 ``x · 2^-e_b`` (``x · 0.75 · 2^-e_b`` for "floor_headroom"), rounded once on
the float32 bits (``fp4jax.ieee.mul_pow2_rn``: subnormal inputs and results as IEEE). E2M1 rounding maps
``|v| < 2^-126`` to ±0, the sign bit set iff ``v < 0``: a code is negative iff ``x < 0`` and the exact product
exceeds 2^-150 in magnitude (``fp4jax.rounding``), the same on CPU and GPU.

Four-over-six (NVFP4; Quartet II, Four Over Six arXiv 2512.02010): each block is rounded (RTN) under both block
targets t = 6 and t = 4 and keeps the one with the smaller error ``E_t`` (``four_over_six_error``, by the format's
``four_over_six_metric``); a tie (equal ``E_t``) keeps t = 6. ``E_t`` is a fixed sequence of IEEE fp32 operations
whose products are exact, so no backend's FMA contraction, reduction order or subnormal flushing changes it: per
element ``d_s = f32(x·2^-F − x̂_t·2^-F)`` (x̂_t the dequantized value, F = max(floor(log2 amax_b), -127); the
scalings are exact, the difference rounded once, and exact where x̂_t is 0 or within a factor 2 of x, as RTN gives
but for the rounding of the scales), ``|d_s| < 2^-40`` counted as 0, then

* ``"mse"``: split ``d_s = hi + lo`` (``hi`` the top 12 significand bits), ``e = f32(f32(hi·hi + 2·hi·lo) + lo·lo)``,
  the block's ``e`` summed pairwise (``fp4jax.reductions``): each square rounded once, each pairwise add once;
* ``"l1"``: the block's ``|d_s|`` summed pairwise, each add rounded once (terms in ``[2^-40, 4)``: the exact sum can
  need some 70 bits; the order is fixed, so the bits are the same everywhere);
* ``"max_abs"``: ``max |d_s|``, exact (an integer max of the float32 bits); equal maxima, common with this metric
  (e.g. both candidates' largest error is an element both round to 0), keep t = 6.

NaN and Inf never become finite: a block holding a non-finite value gets the NaN scale (E4M3 0x7F / E8M0 0xFF),
and for NVFP4 a non-finite tensor amax makes the tensor scale NaN.

Random bits come from ``fp4jax.bits``: a counter-based hash of a seed from ``key`` and the element's row-major
index in ``x`` (the same bits on every backend and under any sharding).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4jax._src import bits as bits_lib
from fp4jax._src import eden
from fp4jax._src import hadamard as hadamard_lib
from fp4jax._src.formats import (
  E2M1_MAX,
  F32_INF_BITS,
  FLT_MAX,
  BlockFP8Format,
  FourOverSixMetric,
  FP4Format,
  e2m1_decode,
)
from fp4jax._src.ieee import add_rn, div_rn, mul_pow2_rn, mul_pow2_rn_f32, mul_rn, mul_short_rn, mul_unflushed, widen
from fp4jax._src.reductions import pairwise_sum
from fp4jax._src.rounding import rtn_e2m1, rtn_e4m3, sr_e2m1
from fp4jax._src.spec import QuantizeSpec, Rounding, Signs


# ------------------------------------------------------------------------------------------------ layout
@dataclasses.dataclass(frozen=True)
class BlockLayout:
  """Moves ``axis`` last, pads to whole blocks and splits into blocks; 2D blocks also tile the other matrix axis."""

  shape: tuple[int, ...]
  axis: int
  block: tuple[int, ...]  # (bs,) or (rows, bs)

  @property
  def moved_shape(self):
    s = list(self.shape)
    s.append(s.pop(self.axis))
    return tuple(s)

  @property
  def padded(self):
    s = list(self.moved_shape)
    for i, b in enumerate(reversed(self.block)):
      s[-1 - i] = -(-s[-1 - i] // b) * b
    return tuple(s)

  @property
  def blocked(self):
    p = self.padded
    if len(self.block) == 1:
      return p[:-1] + (p[-1] // self.block[0], self.block[0])
    (br, bc) = self.block
    return p[:-2] + (p[-2] // br, br, p[-1] // bc, bc)

  @property
  def red_axes(self):
    return (-1,) if len(self.block) == 1 else (-3, -1)

  def to_blocks(self, a: jnp.ndarray) -> jnp.ndarray:
    a = jnp.moveaxis(a, self.axis, -1)
    pad = [(0, p - m) for m, p in zip(self.moved_shape, self.padded)]
    return jnp.pad(a, pad).reshape(self.blocked)

  def from_blocks(self, b: jnp.ndarray) -> jnp.ndarray:
    b = b.reshape(self.padded)[tuple(slice(0, m) for m in self.moved_shape)]
    return jnp.moveaxis(b, -1, self.axis)

  def valid_counts(self) -> jnp.ndarray:
    """Real (unpadded) elements per block, keep-dims float32 (iota arithmetic: no padding op, kernel-safe)."""
    shape = [1] * len(self.blocked)
    count = jnp.ones(shape, jnp.float32)
    for i, b in enumerate(reversed(self.block)):
      ax = -2 - 2 * i  # the block-index axis of this blocked dimension
      n = self.moved_shape[-1 - i]
      shape_b = [1] * len(self.blocked)
      shape_b[ax] = self.blocked[ax]
      start = jax.lax.broadcasted_iota(jnp.int32, shape_b, len(shape_b) + ax) * b
      count = count * jnp.clip(n - start, 0, b).astype(jnp.float32)
    return count

  @property
  def scale_shape(self):
    """Shape of the scale array in the caller's layout: blocked axes divided by the block (rounded up)."""
    s = list(self.shape)
    axes = (self.axis,) if len(self.block) == 1 else (self.axis, self._other_axis)
    for ax, b in zip(axes, (self.block[-1],) + tuple(self.block[:-1])):
      s[ax] = -(-s[ax] // b)
    return tuple(s)

  def scale_origin(self, origin) -> tuple:
    """Where this tensor's scale grid starts in a logical tensor's scale grid when the tensor is the slice of that
    tensor starting at element ``origin`` (one int per dim, may be traced): ``origin`` divided by the block along
    the blocked axes. The slice must start on a block boundary there (the caller checks: else blocks straddle)."""
    origin = list(origin)
    axes = (self.axis,) if len(self.block) == 1 else (self.axis, self._other_axis)
    for ax, b in zip(axes, (self.block[-1],) + tuple(self.block[:-1])):
      origin[ax] = origin[ax] // b
    return tuple(origin)

  @property
  def _other_axis(self):
    nd = len(self.shape)
    return nd - 2 if self.axis == nd - 1 else nd - 1

  def scales_from_blocks(self, s: jnp.ndarray) -> jnp.ndarray:
    """Keep-dims block scales -> the caller's layout (``scale_shape``)."""
    s = jnp.squeeze(s, axis=tuple(a % s.ndim for a in self.red_axes))
    return jnp.moveaxis(s, -1, self.axis)

  def scales_to_blocks(self, s: jnp.ndarray) -> jnp.ndarray:
    s = jnp.moveaxis(s, self.axis, -1)
    keep = list(self.blocked)
    for a in self.red_axes:
      keep[a] = 1
    return s.reshape(keep)


# ------------------------------------------------------------------------------------------------ QTensor
@functools.partial(
  jax.tree_util.register_dataclass,
  data_fields=["codes", "scales", "global_scale", "signs"],
  meta_fields=["shape", "axis", "fmt", "block_shape", "hadamard", "dtype"],
)
@dataclasses.dataclass(frozen=True)
class QTensor:
  """A block-scaled FP4 tensor (a pytree).

  Attributes:
    codes: uint8, two E2M1 codes per byte along ``axis`` (even element in the low nibble); the axis length is
      padded to whole blocks, so ``codes.shape[axis] = ceil(n / block) * block / 2``.
    scales: block scales, ``float8_e4m3fn`` (NVFP4) or ``float8_e8m0fnu`` (MXFP4), ``scale_shape`` of the layout.
    global_scale: fp32 scalar decode scale: ``s_dec`` (≈ amax/(6·448)) for NVFP4, 1 (or 4/3) for MXFP4.
    signs: the Hadamard sign vector when ``hadamard > 0`` (codes then hold the rotated tensor), else None.
    shape, axis, fmt, block_shape, hadamard, dtype: static metadata (logical shape, quantized axis, format,
      block shape, Hadamard size or 0, the input dtype).
  """

  codes: jax.Array
  scales: jax.Array
  global_scale: jax.Array
  signs: jax.Array | None
  shape: tuple[int, ...]
  axis: int
  fmt: FP4Format
  block_shape: tuple[int, ...]
  hadamard: int
  dtype: Any

  @property
  def _layout(self) -> BlockLayout:
    return BlockLayout(self.shape, self.axis, self.block_shape)

  def unpacked_codes(self) -> jnp.ndarray:
    """uint8 codes, one per element, in the caller's layout (padding along ``axis`` dropped)."""
    c = jnp.moveaxis(self.codes, self.axis, -1)
    c = jnp.stack([c & 0xF, c >> 4], axis=-1).reshape(*c.shape[:-1], 2 * c.shape[-1])
    return jnp.moveaxis(c[..., : self.shape[self.axis]], -1, self.axis)

  def scale_values(self) -> jnp.ndarray:
    """Block scales as exact fp32 values (E8M0 decoded from its bits; NaN for the NaN pattern)."""
    return self.fmt.decode_scales(self.scales)

  def dequantize(self, dtype: Any = None, *, rotated: bool = False) -> jnp.ndarray:
    """Dequantized tensor, ``value(q) · scale_b · global_scale``; inverse Hadamard unless ``rotated=True``."""
    lay = self._layout
    codes = lay.to_blocks(self.unpacked_codes())
    dec = lay.scales_to_blocks(self.scale_values())
    y = lay.from_blocks(decode_blocks(codes, dec, self.global_scale))
    return _finish(y, self.hadamard, self.signs, self.axis, rotated, dtype or self.dtype)


def decode_blocks(codes: jnp.ndarray, dec: jnp.ndarray, global_scale: jnp.ndarray) -> jnp.ndarray:
  """``f32(f32(value(codes) · dec) · global_scale)`` (TE's dequantization order), each product rounded once as IEEE
  fp32 with subnormals on every backend (``fp4jax.ieee.mul_short_rn``)."""
  return mul_short_rn(mul_short_rn(e2m1_decode(codes), dec), global_scale)


_ERROR_FLOOR = np.float32(2.0**-40)
_HI_MASK = np.uint32(0xFFFFF000)


def four_over_six_error(
  xb: jnp.ndarray, deq: jnp.ndarray, amax_b: jnp.ndarray, axes: tuple[int, ...], metric: FourOverSixMetric = "mse"
) -> jnp.ndarray:
  """A block's error ``E`` between ``xb`` and its dequantized ``deq`` (keep-dims) by ``metric`` (``"mse"``, ``"l1"``
  or ``"max_abs"``), as specified in the module docstring: on the errors scaled by 2^-floor(log2 amax_b) (``amax_b``
  the block's max|x|, keep-dims), those below 2^-40 dropped. The same float32 bits on every backend.

  A block with a subnormal ``amax_b`` (F < -127) is scaled by 2^127 instead of 2^-F, so that the scaling is a
  product by a float32 (``fp4jax.ieee.mul_pow2_rn_f32``). Both candidates' errors are then those of the 2^-F scaling
  times the same power of two (2^-2s for "mse", 2^-s otherwise; s = -F - 127 > 0), exactly: each element and its
  dequantized value are multiples of 2^-149 of the same sign (or zero), so every ``d_s`` is a multiple of 2^-22
  below 4 (exact, never dropped), and every later operation stays normal, where a power-of-two scaling commutes with
  rounding. So the choice between the candidates is the same."""
  k = 127 - ((lax.bitcast_convert_type(amax_b, jnp.int32) >> 23) & 0xFF)  # min(-F, 127): 127 - the biased exponent
  d = mul_pow2_rn_f32(xb, k) - mul_pow2_rn_f32(deq, k)  # IEEE (xb - deq)·2^k: the scaled values are not subnormal
  d = jnp.where(jnp.abs(d) < _ERROR_FLOOR, jnp.float32(0.0), d)
  if metric == "l1":
    return pairwise_sum(jnp.abs(d), axes)
  if metric == "max_abs":  # an integer max of the magnitude bits: exact, and NaN is not dropped
    mag = lax.bitcast_convert_type(d, jnp.int32) & np.int32(0x7FFFFFFF)
    return lax.bitcast_convert_type(jnp.max(mag, axis=axes, keepdims=True), jnp.float32)
  hi = lax.bitcast_convert_type(lax.bitcast_convert_type(d, jnp.uint32) & _HI_MASK, jnp.float32)
  lo = d - hi  # exact: at most 12 significant bits
  return pairwise_sum((hi * hi + jnp.float32(2.0) * hi * lo) + lo * lo, axes)


_SIGN_BIT = np.uint32(0x80000000)
_TE_ERROR_DENOMINATOR = np.float32(6.0 * 256.0)


def _flip_sign(x: jnp.ndarray) -> jnp.ndarray:
  return lax.bitcast_convert_type(lax.bitcast_convert_type(x, jnp.uint32) ^ _SIGN_BIT, jnp.float32)


def _magnitude(x: jnp.ndarray) -> jnp.ndarray:
  return lax.bitcast_convert_type(lax.bitcast_convert_type(x, jnp.uint32) & ~_SIGN_BIT, jnp.float32)


def te_four_over_six_error(
  xb: jnp.ndarray, codes: jnp.ndarray, dec: jnp.ndarray, amax: jnp.ndarray, axes: tuple[int, ...], metric: str
) -> jnp.ndarray:
  """Transformer Engine's 4over6 block error (keep-dims) of one candidate, as ``NVFP4Format`` specifies for
  ``four_over_six_reference="te"``: ``x̂ = f32(f32(value(codes) · dec · amax) / 1536)``, ``d = f32(x̂ − x)``, the
  16 terms ``|d|`` (``metric="l1"``) or ``f32(d · d)`` (``"mse"``) added left to right along the last axis, then
  (16x16 tiles, ``axes`` of length 2) the rows by halves (``r_i + r_{i+n/2}``, as TE's warp reduction). Every
  operation is one IEEE float32 rounding with subnormals (``fp4jax.ieee``): the same bits on every backend."""
  value = div_rn(mul_short_rn(mul_short_rn(e2m1_decode(codes), dec), amax), _TE_ERROR_DENOMINATOR)
  d = add_rn(value, _flip_sign(xb))
  terms = _magnitude(d) if metric == "l1" else mul_rn(d, d)
  err = jnp.zeros(terms.shape[:-1] + (1,), jnp.float32)
  for i in range(terms.shape[-1]):
    err = add_rn(err, terms[..., i : i + 1])
  if len(axes) == 2:  # TE's __shfl_down_sync tree over the tile's rows (axis -3): offsets n/2, n/4, ..., 1
    while err.shape[-3] > 1:
      half = err.shape[-3] // 2
      err = add_rn(err[..., :half, :, :], err[..., half:, :, :])
  return err


def te_four_over_six(xb, amax_b, amax, tensor_scales, axes: tuple[int, ...], metric: str):
  """``(codes, dec)`` of Transformer Engine's 4over6 choice per block (``NVFP4Format`` with
  ``four_over_six_reference="te"`` specifies the arithmetic); ``tensor_scales`` the 6·256 ``(s_enc, s_dec)`` of
  ``amax``, the tensor's (or per row, keep-dims) max|x|. RTN only, as every four-over-six (``QuantizeSpec``).

  Raises:
    ValueError: ``amax`` is None (TE's error rebuilds x̂ from it: a caller passing only ``tensor_scales`` cannot use
      this mode).
  """
  if amax is None:
    raise ValueError(
      "four_over_six_reference='te' needs the tensor amax (TE rebuilds x̂ from it), got only the tensor scales"
    )
  s_enc, s_dec = tensor_scales
  base = mul_rn(div_rn(amax_b, jnp.float32(E2M1_MAX)), s_enc)
  dec6, dec4 = rtn_e4m3(base), rtn_e4m3(mul_pow2_rn(base, jnp.int32(-1), num=3))  # base·1.5 rounded once

  def candidate(dec):
    enc = jnp.minimum(div_rn(jnp.float32(1.0), mul_short_rn(dec, s_dec)), jnp.float32(FLT_MAX))
    codes = rtn_e2m1(mul_unflushed(xb, enc))
    return codes, lax.bitcast_convert_type(te_four_over_six_error(xb, codes, dec, amax, axes, metric), jnp.int32)

  (codes6, err6), (codes4, err4) = candidate(dec6), candidate(dec4)
  use4 = err4 < err6  # errors are +0 or positive (or NaN): their bits order as their values; a tie keeps 6
  return jnp.where(use4, codes4, codes6), jnp.where(use4, dec4, dec6)


def _finish(y, hadamard: int, signs, axis: int, rotated: bool, dtype) -> jnp.ndarray:
  if hadamard and not rotated:
    y = hadamard_lib.inverse_hadamard(y, hadamard, axis=axis, signs=signs)
  return y.astype(dtype)


# ------------------------------------------------------------------------------------------------ core
def check_quantize_spec(spec: QuantizeSpec) -> None:
  """What ``quantize`` / ``fake_quantize`` compute of a (valid) ``spec``: an FP4 format, no clipping, the tensor's
  amax; TypeError / ValueError naming the field otherwise (those are GEMM operand options, ``fp4jax.dot_general``)."""
  if not isinstance(spec.fmt, FP4Format):
    raise TypeError(f"spec.fmt must be an FP4Format (fp4jax.NVFP4, fp4jax.MXFP4 or a variant), got {spec.fmt!r}")
  if spec.clip != "none":
    raise ValueError(f"spec.clip must be 'none' to quantize a tensor, got {spec.clip!r} (OCC is a GEMM operand's)")
  if spec.amax != "tensor":
    raise ValueError(f"spec.amax must be 'tensor' to quantize a tensor, got {spec.amax!r} (a GEMM operand's option)")


def check_quantize_input(x, spec: QuantizeSpec, axis) -> int:
  """Validate ``x`` and ``axis`` for quantizing by the FP4 ``spec`` with ``quantize``'s block numerics (the spec
  itself is validated by its constructor); returns ``axis`` normalized to ``[0, x.ndim)``."""
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"x must be a floating-point array, got dtype {x.dtype}")
  if x.ndim == 0:
    raise ValueError("x must have at least one dimension to quantize along, got a scalar")
  if x.size == 0:
    raise ValueError(f"x of shape {x.shape} is empty; quantizing needs at least one element (its amax and scales)")
  if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
    raise TypeError(f"axis must be an int, got {axis!r} of type {type(axis).__name__}")
  if not -x.ndim <= axis < x.ndim:
    raise ValueError(f"axis must be in [-{x.ndim}, {x.ndim}) for x of shape {x.shape}, got {axis}")
  axis = int(axis) % x.ndim
  if spec.block_shape is not None:
    if x.ndim < 2:
      raise ValueError(f"block_shape {spec.block_shape} tiles a matrix: x must have ndim >= 2, got shape {x.shape}")
    if axis < x.ndim - 2:
      raise ValueError(f"with 2D blocks, axis must be one of the last two dimensions, got axis={axis} for {x.shape}")
  return axis


def block_dims(spec: QuantizeSpec) -> tuple[int, ...]:
  """The block shape of an FP4 ``spec`` as a tuple: ``(fmt.block_size,)`` or its 2D tile."""
  return (spec.fmt.block_size,) if spec.block_shape is None else spec.block_shape


def needs_quantize_key(key, rounding, hadamard, hadamard_signs) -> bool:
  """Whether a quantization draws random bits or signs; errors if it does and ``key`` is missing."""
  if not (rounding in ("sr", "eden") or (hadamard and hadamard_signs == "random")):
    return False
  if key is None:
    what = f"rounding={rounding!r}" if rounding != "rtn" else f"hadamard={hadamard} with random signs"
    raise ValueError(f"key is required for {what}: pass key=jax.random.key(...)")
  return True


def split_quantize_key(key, rounding, hadamard, hadamard_signs):
  """(signs key, element-bits key, scale-bits key), or Nones when nothing is random; errors if ``key`` is missing."""
  if not needs_quantize_key(key, rounding, hadamard, hadamard_signs):
    return None, None, None
  return tuple(jax.random.split(key, 3))


def quantize_blocks(
  xb, lay: BlockLayout, fmt: FP4Format, rounding: str, bits, scale_bits, amax=None, tensor_scales=None
):
  """The block numerics of ``quantize``, shared with the Pallas kernels (which call it on one tile).

  Blocked fp32 ``xb`` -> (codes, fp32 block scales (keep-dims), tensor decode scale, E8M0 exponents or None).
  ``amax`` is the tensor's max|x| (NaN if any element is non-finite); None computes it from ``xb``. A keep-dims
  ``amax`` per row (shape ``xb.shape[:-2] + (1, 1)``, 1D blocks) gives each row its own NVFP4 tensor scale, which is
  then returned per row too: each row quantized as if alone (``OperandSpec.amax="row"``).
  ``tensor_scales``: NVFP4's ``(s_enc, s_dec)`` of that amax (``fmt.tensor_scales(amax, rounding)``), when the
  caller computed them once for many calls (the kernels' tiles).
  The block max is an integer max of the magnitude bits (XLA's CPU float max may drop NaN; NaN's bits exceed +Inf's
  on every backend), and a block is non-finite iff that max reaches +Inf's bits.
  """
  axes = lay.red_axes
  amax_bits = jnp.max(lax.bitcast_convert_type(xb, jnp.int32) & 0x7FFFFFFF, axis=axes, keepdims=True)
  nonfinite = amax_bits >= F32_INF_BITS
  amax_b = lax.bitcast_convert_type(amax_bits, jnp.float32)
  if amax is None and tensor_scales is None:
    amax = lax.bitcast_convert_type(jnp.max(amax_bits), jnp.float32)  # an integer max: no subnormal flushed
    amax = jnp.where(jnp.any(nonfinite), jnp.float32(jnp.nan), amax)
  round_codes = (lambda v: sr_e2m1(v, bits)) if rounding == "sr" else rtn_e2m1
  if tensor_scales is None:
    tensor_scales = fmt.tensor_scales(amax, rounding)
  sigma = _block_std(xb, lay, amax_b) if fmt.needs_block_std else None
  scaled, dec, exps, global_scale = fmt.scale_blocks(xb, amax_b, tensor_scales, rounding, sigma)
  codes = round_codes(scaled)  # the roundings saturate at ±6
  if fmt.scale_mode == "four_over_six" and fmt.four_over_six_reference == "te":
    codes, dec = te_four_over_six(xb, amax_b, amax, tensor_scales, axes, fmt.four_over_six_metric)
  elif fmt.scale_mode == "four_over_six":  # NVFP4 (Quartet II): the lower-error of block targets 6 and 4, by RTN
    dec4, enc4 = fmt.block_scales(amax_b, tensor_scales, 4.0)
    codes4 = rtn_e2m1(mul_unflushed(xb, enc4))
    metric = fmt.four_over_six_metric
    err = lambda c, d: four_over_six_error(xb, decode_blocks(c, d, global_scale), amax_b, axes, metric)
    use4 = err(codes4, dec4) < err(codes, dec)
    codes, dec = jnp.where(use4, codes4, codes), jnp.where(use4, dec4, dec)
  elif rounding == "eden":
    dec = eden.corrected_scale(dec, eden.correction(scaled, codes, axes), scale_bits)
  dec = jnp.where(nonfinite, jnp.float32(jnp.nan), dec)
  return codes, dec, global_scale, exps


def _block_std(xb, lay: BlockLayout, amax_b):
  """Per-block standard deviation over the real (unpadded) elements: sqrt(max(E[x²] - E[x]², 0)), the sums
  pairwise in a fixed order (``fp4jax.reductions``). A block with max|x| >= 2^60 (whose x² could overflow float32)
  is computed on x · 2^-80 and its σ multiplied by 2^80 (both exact powers of two; below 2^60 nothing is scaled)."""
  axes = lay.red_axes
  big = amax_b >= jnp.float32(2.0**60)
  xb = jnp.where(big, xb * jnp.float32(2.0**-80), xb)
  count = jnp.maximum(lay.valid_counts(), 1.0)
  mean = div_rn(pairwise_sum(xb, axes), count)
  mean_sq = div_rn(pairwise_sum(xb * xb, axes), count)
  sigma = jnp.sqrt(jnp.maximum(mean_sq - mean * mean, 0.0))
  return jnp.where(big, sigma * jnp.float32(2.0**80), sigma)


def _run(x, spec: QuantizeSpec, axis, key):
  x = jnp.asarray(x)
  check_quantize_spec(spec)
  axis = check_quantize_input(x, spec, axis)
  k_signs, k_elems, k_scales = split_quantize_key(key, spec.rounding, spec.hadamard, spec.signs)
  signs = spec.sign_vector(k_signs)
  hadamard, fmt, rounding = spec.hadamard, spec.fmt, spec.rounding
  xf = hadamard_lib.rotated(x, hadamard, axis=axis, signs=signs) if hadamard else widen(x)
  lay = BlockLayout(x.shape, axis, block_dims(spec))
  bits = lay.to_blocks(bits_lib.random_bits(k_elems, x.shape)) if rounding == "sr" else None
  scale_bits = lay.scales_to_blocks(bits_lib.random_bits(k_scales, lay.scale_shape)) if rounding == "eden" else None
  codes, dec, global_scale, exps = quantize_blocks(lay.to_blocks(xf), lay, fmt, rounding, bits, scale_bits)
  return lay, codes, dec, global_scale, exps, signs


class _Unset:
  """The default of the keyword form's options: tells "not given" from any value (a spec takes none of them)."""

  def __repr__(self) -> str:
    return "<default>"


_UNSET: Any = _Unset()


def _spec_of(spec, options: dict) -> QuantizeSpec:
  """``spec`` itself (no keyword option given: they describe the spec) or the keyword form's ``QuantizeSpec.of``;
  ``options["fmt"]`` is the format passed by keyword (the keyword form's historical name for ``spec``)."""
  given = {k: v for k, v in options.items() if v is not _UNSET}
  fmt = given.pop("fmt", None)
  if (spec is None) == (fmt is None):
    raise TypeError(f"pass a QuantizeSpec or a format, positionally or as fmt=, once; got {spec!r} and fmt={fmt!r}")
  if isinstance(spec, QuantizeSpec):
    if given:
      raise TypeError(
        f"pass either a QuantizeSpec or a format with keyword options, not both: got a spec and {sorted(given)}"
      )
    return spec
  return QuantizeSpec.of(fmt if spec is None else spec, **given)


def quantize(
  x: jax.Array,
  spec: QuantizeSpec | FP4Format | None = None,
  *,
  fmt: FP4Format = _UNSET,
  axis: int = -1,
  key: jax.Array | None = None,
  rounding: Rounding = _UNSET,
  block_shape: tuple[int, ...] | None = _UNSET,
  hadamard: int | Literal["auto"] | None = _UNSET,
  hadamard_signs: Signs = _UNSET,
) -> QTensor:
  """Quantize ``x`` to a block-scaled FP4 ``QTensor`` along ``axis``, as ``spec`` says.

  ``quantize(x, spec)`` with a ``QuantizeSpec``, or ``quantize(x, fmt, rounding=..., ...)``: the keyword form, the
  spec ``QuantizeSpec.of(fmt, rounding=..., ...)`` (the same bits). The numerics are the module docstring's.

  Args:
    x: float array or array-like (f32/bf16/f16, converted by ``jnp.asarray``), not empty, any shape and length along
      ``axis`` (partial blocks are zero-padded).
    spec: a ``QuantizeSpec`` with an ``FP4Format`` ``fmt``, ``clip="none"`` and ``amax="tensor"``; or an
      ``FP4Format`` (``fp4jax.NVFP4``, ``fp4jax.MXFP4`` or a ``dataclasses.replace`` of them) for the keyword form.
    fmt: the keyword form's format passed by keyword (``quantize(x, fmt=fp4jax.NVFP4)``), instead of ``spec``.
    axis: the axis blocks run along (the GEMM's contraction axis), an int.
    key: JAX PRNG key; required exactly when the rounding is random or the Hadamard signs are ``"random"``.
    rounding: keyword form only (default ``"rtn"``): ``"rtn"`` (nearest, ties to even), ``"sr"`` (stochastic,
      unbiased) or ``"eden"`` (MS-EDEN, NVFP4).
    block_shape: keyword form only (default None): None for 1D blocks of ``fmt.block_size``; ``(16, 16)`` for
      NVFP4 2D tiles of the last two dims (a tuple, never a bare int).
    hadamard: keyword form only (default ``"auto"``): blockwise Hadamard size applied along ``axis`` before
      quantizing (0/None: none); ``"auto"`` means 128 for ``rounding="eden"`` (its random rotation), else none.
    hadamard_signs: keyword form only (default ``"random"``): ``"random"`` (from ``key``), ``"te"`` (Transformer
      Engine's fixed 16 signs), ``"fixed"`` (one constant random vector) or ``"none"``.

  Returns:
    The ``QTensor`` (packed codes, block scales, tensor scale, the Hadamard signs if any).

  Raises:
    TypeError: ``x`` not floating point, ``spec`` neither a ``QuantizeSpec`` nor an ``FP4Format``, both or neither of
      ``spec`` and ``fmt``, a spec together with keyword options, ``axis`` not an int, ``block_shape`` not a tuple
      of ints.
    ValueError: ``x`` a scalar or empty, ``axis`` out of range, a random option without ``key``, or an option the
      format does not take (naming the ``QuantizeSpec`` field).
  """
  options = dict(fmt=fmt, rounding=rounding, block_shape=block_shape, hadamard=hadamard, hadamard_signs=hadamard_signs)
  return _quantize_jit(jnp.asarray(x), _spec_of(spec, options), axis, key)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _quantize_jit(x, spec: QuantizeSpec, axis, key) -> QTensor:
  lay, codes, dec, global_scale, exps, signs = _run(x, spec, axis, key)
  fmt = spec.fmt
  scales = fmt.encode_scales(lay.scales_from_blocks(dec), None if exps is None else lay.scales_from_blocks(exps))
  return QTensor(
    codes=_pack(codes, lay),
    scales=scales,
    global_scale=jnp.asarray(global_scale, jnp.float32),
    signs=signs,
    shape=tuple(x.shape),
    axis=lay.axis,
    fmt=fmt,
    block_shape=lay.block,
    hadamard=spec.hadamard,
    dtype=jnp.asarray(x).dtype,
  )


def fake_quantize(
  x: jax.Array,
  spec: QuantizeSpec | FP4Format | None = None,
  *,
  fmt: FP4Format = _UNSET,
  axis: int = -1,
  key: jax.Array | None = None,
  rounding: Rounding = _UNSET,
  block_shape: tuple[int, ...] | None = _UNSET,
  hadamard: int | Literal["auto"] | None = _UNSET,
  hadamard_signs: Signs = _UNSET,
  rotated: bool = False,
  dtype: Any = None,
) -> jax.Array:
  """``quantize(x, spec, ...).dequantize(dtype)`` without packing: the same bits, fewer passes.

  Args:
    x, spec, fmt, axis, key, rounding, block_shape, hadamard, hadamard_signs: as ``quantize``.
    rotated: return the quantized tensor in the Hadamard domain (what a GEMM whose operands share the rotation
      consumes) instead of rotating it back.
    dtype: the result's dtype; defaults to ``x.dtype``.

  Returns:
    The dequantized tensor, ``x``'s shape.

  Raises:
    TypeError, ValueError: as ``quantize``.
  """
  options = dict(fmt=fmt, rounding=rounding, block_shape=block_shape, hadamard=hadamard, hadamard_signs=hadamard_signs)
  spec = _spec_of(spec, options)
  lay, codes, dec, global_scale, _, signs = _run(x, spec, axis, key)
  y = lay.from_blocks(decode_blocks(codes, dec, global_scale))
  return _finish(y, spec.hadamard, signs, lay.axis, rotated, dtype or jnp.asarray(x).dtype)


def _pack(codes_blocked: jnp.ndarray, lay: BlockLayout) -> jnp.ndarray:
  """Blocked codes -> uint8 pairs along ``axis`` (even element low nibble), other-axis padding dropped."""
  c = codes_blocked.reshape(lay.padded)
  if len(lay.block) == 2:
    c = c[..., : lay.moved_shape[-2], :]
  c = c.reshape(*c.shape[:-1], c.shape[-1] // 2, 2)
  packed = (c[..., 0] | (c[..., 1] << 4)).astype(jnp.uint8)
  return jnp.moveaxis(packed, -1, lay.axis)


# ------------------------------------------------------------------------------------------------ block-scaled FP8
def fp8_block_spec(fmt: BlockFP8Format, block_shape: tuple[int, ...] | None) -> QuantizeSpec:
  """The ``QuantizeSpec`` of ``quantize_fp8_blocks``' arguments (validated by its constructor)."""
  if not isinstance(fmt, BlockFP8Format):
    raise TypeError(
      f"fmt must be a BlockFP8Format such as fp4jax.MXFP8 or fp4jax.FP8_BLOCK (a format object), got {fmt!r}"
    )
  return QuantizeSpec(fmt, block_shape=block_shape)


def fp8_blocks(x: jax.Array, spec: QuantizeSpec, axis: int) -> tuple[BlockLayout, jax.Array, jax.Array]:
  """``(layout, v, dec)``: ``x`` quantized along ``axis`` by the ``BlockFP8Format`` ``spec.fmt`` in blocks of
  ``spec`` (zero padding to whole blocks), blocked (``BlockFP8Format.quantize_blocks``). ``axis`` normalized."""
  lay = BlockLayout(x.shape, axis, block_dims(spec))
  v, dec = spec.fmt.quantize_blocks(lay.to_blocks(widen(x)), lay.red_axes)
  return lay, v, dec


@functools.partial(jax.jit, static_argnames=("fmt", "axis", "block_shape"))
def quantize_fp8_blocks(
  x: jax.Array, fmt: BlockFP8Format, *, axis: int = -1, block_shape: tuple[int, ...] | None = None
) -> tuple[jax.Array, jax.Array]:
  """Quantize ``x`` to block-scaled FP8 (``fp4jax.MXFP8``, ``fp4jax.FP8_BLOCK`` or a variant) along ``axis``.

  The numerics are ``BlockFP8Format``'s (E4M3 elements by nearest-even after the block scale; NaN/Inf blocks NaN)
  and the format's scale rule (``MXFP8Format``: OCP MX v1.0; ``FP8BlockFormat``: DeepSeek-V3's amax / 448).
  Dequantized: ``f32(float32(elements) · decode(scale))`` per element, rounded once.

  Args:
    x: float array (f32/bf16/f16), not empty, any shape and length along ``axis`` (partial blocks are zero-padded).
    fmt: a ``BlockFP8Format``.
    axis: the axis blocks run along (a GEMM's contraction axis), an int.
    block_shape: None (1 x ``fmt.block_size`` blocks along ``axis``) or one of ``fmt.tile_shapes`` (FP8_BLOCK:
      ``(128, 128)`` blocks of the last two dims; ``axis`` one of them).

  Returns:
    ``(elements, scales)``: ``float8_e4m3fn`` of ``x``'s shape, and the block scales in ``fmt.scale_dtype``
    (``float8_e8m0fnu`` for MXFP8, float32 decode scales for FP8_BLOCK) of ``x``'s shape with the blocked dims
    divided by the block, rounded up.

  Raises:
    TypeError: ``fmt`` not a ``BlockFP8Format``, ``x`` not floating point, ``axis`` not an int.
    ValueError: ``x`` a scalar or empty, ``axis`` out of range, a ``block_shape`` the format does not take.
  """
  spec = fp8_block_spec(fmt, block_shape)
  axis = check_quantize_input(x, spec, axis)
  lay, v, dec = fp8_blocks(x, spec, axis)
  return lay.from_blocks(v).astype(jnp.float8_e4m3fn), fmt.encode_scales(lay.scales_from_blocks(dec))  # v: exact


@functools.partial(jax.jit, static_argnames=("fmt", "axis", "block_shape", "dtype"))
def fake_quantize_fp8_blocks(
  x: jax.Array, fmt: BlockFP8Format, *, axis: int = -1, block_shape: tuple[int, ...] | None = None, dtype=None
) -> jax.Array:
  """``quantize_fp8_blocks`` followed by its dequantization, ``f32(v · dec_b)`` (the same bits, without the
  float8 arrays).

  Args:
    x, fmt, axis, block_shape: as ``quantize_fp8_blocks``.
    dtype: the result's dtype; defaults to ``x.dtype``.

  Returns:
    The dequantized tensor, ``x``'s shape.

  Raises:
    TypeError, ValueError: as ``quantize_fp8_blocks``.
  """
  spec = fp8_block_spec(fmt, block_shape)
  axis = check_quantize_input(x, spec, axis)
  lay, v, dec = fp8_blocks(x, spec, axis)
  return lay.from_blocks(fmt.dequantize_blocks(v, dec)).astype(dtype or x.dtype)


def packed_nbytes(q: QTensor) -> int:
  """Bytes a ``QTensor`` stores: codes + scales + the fp32 tensor scale."""
  return int(np.prod(q.codes.shape)) + int(np.prod(q.scales.shape)) + 4
