"""``quantize`` / ``fake_quantize`` / ``QTensor``: block-scaled FP4 quantization along any axis.

The pipeline, all in fp32 and explicit arithmetic (see ``fp4jax.scaling``, ``fp4jax.rounding``, ``fp4jax.eden``):

    x ─► optional blockwise Hadamard along ``axis`` (bf16 inputs: rounded once to bf16, as TE)
      ─► pad ``axis`` (and, for 2D blocks, the other matrix axis) with zeros to whole blocks
      ─► tensor scale (NVFP4) and block scales ─► E2M1 codes by RTN / SR / MS-EDEN ─► QTensor or dequantized array

Dequantized value of an element: ``f32(value(q) · f32(dec_b)) · s_dec`` (NVFP4, TE order) or
``f32(value(q) · 2^e_b) · g`` (MXFP4, ``g`` = 1, or f32(4/3) for the "floor_headroom" mode), each product rounded
once as IEEE fp32 with subnormals (``fp4jax.ieee.mul_short_rn``: exact integer arithmetic, no backend flushes).

Element scaling: NVFP4 ``x · enc_b`` (fp32, subnormal ``x`` counted at its value: ``fp4jax.ieee.mul_unflushed``);
MXFP4 ``x · 2^-e_b`` (``x · 0.75 · 2^-e_b`` for "floor_headroom"), rounded once on the float32 bits
(``fp4jax.ieee.mul_pow2_rn``: subnormal inputs and results as IEEE). E2M1 rounding maps ``|v| < 2^-126`` to ±0.

Four-over-six (NVFP4, Quartet II): each block is rounded (RTN) under both block targets t = 6 and t = 4 and keeps
the one with the smaller error ``E_t`` (``four_over_six_error``); a tie keeps t = 6. ``E_t`` is a fixed sequence
of IEEE fp32 operations whose products are exact, so no backend's FMA contraction, reduction order or subnormal
flushing changes it: per element ``d = f32(x - x̂_t)`` (x̂_t the dequantized value), ``d_s = d · 2^-F`` rounded once
(F = floor(log2 amax_b)), ``|d_s| < 2^-40`` counted as 0, split ``d_s = hi + lo`` (``hi`` the top 12 significand
bits), ``e = f32(f32(hi·hi + 2·hi·lo) + lo·lo)``, and the block's ``e`` summed pairwise (``fp4jax.reductions``).

NaN and Inf never become finite: a block holding a non-finite value gets the NaN scale (E4M3 0x7F / E8M0 0xFF),
and for NVFP4 a non-finite tensor amax makes the tensor scale NaN.

Random bits come from ``fp4jax.bits``: a counter-based hash of a seed from ``key`` and the element's row-major
index in ``x`` (the same bits on every backend and under any sharding).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4jax._src import bits as bits_lib
from fp4jax._src import eden
from fp4jax._src import hadamard as hadamard_lib
from fp4jax._src.formats import F32_INF_BITS, FP4Format, e2m1_decode, floor_log2
from fp4jax._src.ieee import div_rn, mul_pow2_rn, mul_short_rn, mul_unflushed
from fp4jax._src.reductions import pairwise_sum
from fp4jax._src.rounding import rtn_e2m1, sr_e2m1

ROUNDINGS = ("rtn", "sr", "eden")
SIGN_MODES = ("random", "te", "none")
EDEN_HADAMARD = 128


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


def four_over_six_error(xb: jnp.ndarray, deq: jnp.ndarray, amax_b: jnp.ndarray, axes: tuple[int, ...]) -> jnp.ndarray:
  """A block's squared error ``E`` between ``xb`` and its dequantized ``deq`` (keep-dims), as specified in the module
  docstring: scaled by 2^-floor(log2 amax_b), errors below 2^-40 dropped, squares from exact split products,
  summed pairwise. The same float32 bits on every backend."""
  k = -floor_log2(amax_b)
  d = mul_pow2_rn(xb, k) - mul_pow2_rn(deq, k)  # IEEE (xb - deq)·2^k: the scaled values are not subnormal
  d = jnp.where(jnp.abs(d) < _ERROR_FLOOR, jnp.float32(0.0), d)
  hi = lax.bitcast_convert_type(lax.bitcast_convert_type(d, jnp.uint32) & _HI_MASK, jnp.float32)
  lo = d - hi  # exact: at most 12 significant bits
  return pairwise_sum((hi * hi + jnp.float32(2.0) * hi * lo) + lo * lo, axes)


def _finish(y, hadamard: int, signs, axis: int, rotated: bool, dtype) -> jnp.ndarray:
  if hadamard and not rotated:
    y = hadamard_lib.inverse_hadamard(y, hadamard, axis=axis, signs=signs)
  return y.astype(dtype)


# ------------------------------------------------------------------------------------------------ core
def check_quantize_args(x, fmt, axis, rounding, block_shape, hadamard, hadamard_signs):
  """Validate ``quantize``'s arguments; returns (normalized axis, block shape, Hadamard size or 0)."""
  if not isinstance(fmt, FP4Format):
    raise TypeError(
      f"fmt must be an FP4Format such as fp4jax.NVFP4 or fp4jax.MXFP4 (a format object, not a name), got {fmt!r}"
    )
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
  if rounding not in ROUNDINGS:
    raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
  if hadamard == "auto":
    hadamard = EDEN_HADAMARD if rounding == "eden" else 0
  hadamard = int(hadamard or 0)
  if hadamard:
    hadamard_lib.check_size(hadamard, "hadamard")
  if hadamard_signs not in SIGN_MODES:
    raise ValueError(f"hadamard_signs must be one of {SIGN_MODES}, got {hadamard_signs!r}")
  if hadamard_signs == "te" and hadamard not in (0, 16):
    raise ValueError(f"hadamard_signs='te' is Transformer Engine's 16-point sign vector; got hadamard={hadamard}")
  block = (fmt.block_size,) if block_shape is None else _static_block_shape(block_shape)
  if block_shape is not None:
    if len(block) == 1:
      if block[0] != fmt.block_size:
        raise ValueError(f"block_shape {block_shape} must match the format's block size {fmt.block_size}")
    elif len(block) == 2:
      if block not in fmt.tile_shapes:
        raise ValueError(f"block_shape {block_shape}: {fmt!r} takes the 2D blocks {fmt.tile_shapes} (NVFP4: (16, 16))")
      if x.ndim < 2:
        raise ValueError(f"block_shape (16, 16) tiles a matrix: x must have ndim >= 2, got shape {x.shape}")
      if axis < x.ndim - 2:
        raise ValueError(f"with 2D blocks, axis must be one of the last two dimensions, got axis={axis} for {x.shape}")
    else:
      raise ValueError(f"block_shape must be (block,) or (16, 16), got {block_shape}")
  if rounding == "eden":
    if not fmt.takes_eden or len(block) != 1:
      raise ValueError("rounding='eden' is MS-EDEN for NVFP4 1x16 blocks: use fp4jax.NVFP4 and no block_shape")
  if fmt.scale_mode == "four_over_six" and rounding != "rtn":
    raise ValueError(
      f"scale_mode 'four_over_six' chooses scales by RTN error; rounding must be 'rtn', got {rounding!r}"
    )
  return axis, block, hadamard


def split_quantize_key(key, rounding, hadamard, hadamard_signs):
  """(signs key, element-bits key, scale-bits key), or Nones when nothing is random; errors if ``key`` is missing."""
  needs = rounding in ("sr", "eden") or (hadamard and hadamard_signs == "random")
  if not needs:
    return None, None, None
  if key is None:
    what = f"rounding={rounding!r}" if rounding != "rtn" else f"hadamard={hadamard} with random signs"
    raise ValueError(f"key is required for {what}: pass key=jax.random.key(...)")
  return tuple(jax.random.split(key, 3))


def hadamard_sign_vector(hadamard, hadamard_signs, key):
  """The ±1 sign vector of the Hadamard transform (TE's, random from ``key``), or None."""
  if not hadamard or hadamard_signs == "none":
    return None
  if hadamard_signs == "te":
    return jnp.asarray(hadamard_lib.TE_SIGNS_16)
  return hadamard_lib.random_signs(key, hadamard)


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
  sigma = _block_std(xb, lay) if fmt.needs_block_std else None
  scaled, dec, exps, global_scale = fmt.scale_blocks(xb, amax_b, tensor_scales, rounding, sigma)
  codes = round_codes(scaled)  # the roundings saturate at ±6
  if fmt.scale_mode == "four_over_six":  # NVFP4 (Quartet II): the lower-error of block targets 6 and 4, by RTN
    dec4, enc4 = fmt.block_scales(amax_b, tensor_scales, 4.0)
    codes4 = rtn_e2m1(mul_unflushed(xb, enc4))
    err = lambda c, d: four_over_six_error(xb, decode_blocks(c, d, global_scale), amax_b, axes)
    use4 = err(codes4, dec4) < err(codes, dec)
    codes, dec = jnp.where(use4, codes4, codes), jnp.where(use4, dec4, dec)
  elif rounding == "eden":
    dec = eden.corrected_scale(dec, eden.correction(scaled, codes, axes), scale_bits)
  dec = jnp.where(nonfinite, jnp.float32(jnp.nan), dec)
  return codes, dec, global_scale, exps


def _block_std(xb, lay: BlockLayout):
  """Per-block standard deviation over the real (unpadded) elements: sqrt(max(E[x²] - E[x]², 0)), the sums
  pairwise in a fixed order (``fp4jax.reductions``)."""
  axes = lay.red_axes
  count = jnp.maximum(lay.valid_counts(), 1.0)
  mean = div_rn(pairwise_sum(xb, axes), count)
  mean_sq = div_rn(pairwise_sum(xb * xb, axes), count)
  return jnp.sqrt(jnp.maximum(mean_sq - mean * mean, 0.0))


def _run(x, fmt, axis, rounding, key, block_shape, hadamard, hadamard_signs):
  x = jnp.asarray(x)
  axis, block, hadamard = check_quantize_args(x, fmt, axis, rounding, block_shape, hadamard, hadamard_signs)
  k_signs, k_elems, k_scales = split_quantize_key(key, rounding, hadamard, hadamard_signs)
  signs = hadamard_sign_vector(hadamard, hadamard_signs, k_signs)
  xf = hadamard_lib.rotated(x, hadamard, axis=axis, signs=signs) if hadamard else x.astype(jnp.float32)
  lay = BlockLayout(x.shape, axis, block)
  bits = lay.to_blocks(bits_lib.random_bits(k_elems, x.shape)) if rounding == "sr" else None
  scale_bits = lay.scales_to_blocks(bits_lib.random_bits(k_scales, lay.scale_shape)) if rounding == "eden" else None
  codes, dec, global_scale, exps = quantize_blocks(lay.to_blocks(xf), lay, fmt, rounding, bits, scale_bits)
  return lay, codes, dec, global_scale, exps, signs, hadamard


_STATIC = ("fmt", "axis", "rounding", "block_shape", "hadamard", "hadamard_signs")


def _static_block_shape(block_shape):
  """``block_shape`` as a tuple of ints (None stays None); TypeError unless it is a sequence of ints."""
  if block_shape is None:
    return None
  if not isinstance(block_shape, (tuple, list)) or not all(
    isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in block_shape
  ):
    raise TypeError(f"block_shape must be None or a tuple of ints such as (16,) or (16, 16), got {block_shape!r}")
  return tuple(int(b) for b in block_shape)


def quantize(
  x: jax.Array,
  fmt: FP4Format,
  *,
  axis: int = -1,
  rounding: str = "rtn",
  key: jax.Array | None = None,
  block_shape: tuple[int, ...] | None = None,
  hadamard: int | str | None = "auto",
  hadamard_signs: str = "random",
) -> QTensor:
  """Quantize ``x`` to a block-scaled FP4 ``QTensor`` along ``axis``.

  Args:
    x: float array or array-like (f32/bf16/f16, converted by ``jnp.asarray``), not empty, any shape and length along
      ``axis`` (partial blocks are zero-padded).
    fmt: ``fp4jax.NVFP4`` or ``fp4jax.MXFP4`` (or a ``dataclasses.replace`` of them, e.g. another ``scale_mode``).
    axis: the axis blocks run along (the GEMM's contraction axis), an int.
    rounding: ``"rtn"`` (nearest, ties to even), ``"sr"`` (stochastic, unbiased) or ``"eden"`` (MS-EDEN, NVFP4).
    key: JAX PRNG key; required exactly when ``rounding`` is random or the Hadamard signs are random.
    block_shape: None for 1D blocks of ``fmt.block_size``; ``(16, 16)`` for NVFP4 2D tiles of the last two dims
      (a tuple, never a bare int).
    hadamard: blockwise Hadamard size applied along ``axis`` before quantizing (0/None: none); ``"auto"`` means
      128 for ``rounding="eden"`` (its random rotation) and none otherwise.
    hadamard_signs: ``"random"`` (from ``key``), ``"te"`` (Transformer Engine's fixed 16 signs) or ``"none"``.

  Raises:
    TypeError: ``x`` not floating point, ``fmt`` not an ``FP4Format``, ``axis`` not an int, ``block_shape`` not a
      tuple of ints.
    ValueError: ``x`` a scalar or empty, ``axis`` out of range, or an option the format does not take.
  """
  return _quantize_jit(
    jnp.asarray(x),
    fmt=fmt,
    axis=axis,
    rounding=rounding,
    key=key,
    block_shape=_static_block_shape(block_shape),
    hadamard=hadamard,
    hadamard_signs=hadamard_signs,
  )


@functools.partial(jax.jit, static_argnames=_STATIC)
def _quantize_jit(x, *, fmt, axis, rounding, key, block_shape, hadamard, hadamard_signs) -> QTensor:
  lay, codes, dec, global_scale, exps, signs, hadamard = _run(
    x, fmt, axis, rounding, key, block_shape, hadamard, hadamard_signs
  )
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
    hadamard=hadamard,
    dtype=jnp.asarray(x).dtype,
  )


def fake_quantize(
  x: jax.Array,
  fmt: FP4Format,
  *,
  axis: int = -1,
  rounding: str = "rtn",
  key: jax.Array | None = None,
  block_shape: tuple[int, ...] | None = None,
  hadamard: int | str | None = "auto",
  hadamard_signs: str = "random",
  rotated: bool = False,
  dtype: Any = None,
) -> jax.Array:
  """``quantize(x, ...).dequantize(dtype)`` without packing: the same bits, fewer passes.

  ``rotated=True`` returns the quantized tensor in the Hadamard domain (what a GEMM whose operands share the
  rotation consumes); ``dtype`` defaults to ``x.dtype``. Arguments and errors as ``quantize``.
  """
  lay, codes, dec, global_scale, _, signs, hadamard = _run(
    x, fmt, axis, rounding, key, block_shape, hadamard, hadamard_signs
  )
  y = lay.from_blocks(decode_blocks(codes, dec, global_scale))
  return _finish(y, hadamard, signs, lay.axis, rotated, dtype or jnp.asarray(x).dtype)


def _pack(codes_blocked: jnp.ndarray, lay: BlockLayout) -> jnp.ndarray:
  """Blocked codes -> uint8 pairs along ``axis`` (even element low nibble), other-axis padding dropped."""
  c = codes_blocked.reshape(lay.padded)
  if len(lay.block) == 2:
    c = c[..., : lay.moved_shape[-2], :]
  c = c.reshape(*c.shape[:-1], c.shape[-1] // 2, 2)
  packed = (c[..., 0] | (c[..., 1] << 4)).astype(jnp.uint8)
  return jnp.moveaxis(packed, -1, lay.axis)


def packed_nbytes(q: QTensor) -> int:
  """Bytes a ``QTensor`` stores: codes + scales + the fp32 tensor scale."""
  return int(np.prod(q.codes.shape)) + int(np.prod(q.scales.shape)) + 4
