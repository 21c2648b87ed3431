"""Formats as objects: each format class owns its metadata and the behaviour that differs between formats.

A format is an instance of a frozen dataclass (``NVFP4``, ``MXFP4``, ``E4M3``, ``E5M2``, ``E2M1_CHANNEL``); code
outside this module asks the object (its attributes and methods, or ``isinstance`` on its class where an
implementation must be picked), never its name. ``name`` is a class constant (or derived from the fields), so
``dataclasses.replace`` cannot relabel a format. A variant is another instance, e.g.
``dataclasses.replace(MXFP4, scale_mode="quest")`` or ``MXFP4Format(block_size=16)``.

* ``FP4Format``: block-scaled E2M1 (``fp4jax.quantize``): one scale per ``block_size`` elements along the quantized
  axis. ``NVFP4Format``: E4M3 block scales under an FP32 tensor scale (TE's order, ``fp4jax.scaling``);
  ``MXFP4Format``: power-of-two E8M0 block scales (OCP MX v1.0), no tensor scale.
* ``FP8Format``: OCP FP8 elements with one per-tensor current scale (``fp4jax.fp8``).
* ``E2M1ChannelFormat``: E2M1 with one absmax scale per row along the contraction axis (Microsoft FP4).

The element and scale encodings these are built from (E2M1 codes, E4M3/E8M0 bits, exact float32 helpers) live in
``fp4jax.elements`` and are re-exported here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Literal, get_args

import jax
import jax.numpy as jnp
from jax import lax

from fp4jax._src import scaling
from fp4jax._src.elements import (  # noqa: F401 (re-exported: the encodings' historical home)
  E2M1_MAX,
  E2M1_SIGN_BIT,
  E2M1_VALUES,
  E4M3_MAX,
  E4M3_NAN_BITS,
  E8M0_BIAS,
  E8M0_NAN_BITS,
  F32_INF_BITS,
  FLT_MAX,
  e2m1_decode,
  e4m3_bits,
  e4m3_bits_to_f32,
  e4m3_step_exponent,
  e8m0_bits_to_f32,
  floor_log2,
  pow2,
)
from fp4jax._src.ieee import div_rn, mul_pow2_rn, mul_pow2_rn_f32, mul_short_rn, mul_unflushed, significand

ScaleMode = Literal["absmax", "four_over_six", "floor", "rceil", "quest", "quest_nearest", "floor_headroom"]
FourOverSixMetric = Literal["mse", "l1", "max_abs"]
FourOverSixReference = Literal["fp4jax", "te"]


@dataclasses.dataclass(frozen=True, repr=False)
class Format:
  """Base class of the formats an operand is quantized to; ``name`` is for messages and files only (the repr
  shows it first, e.g. ``NVFP4Format(name='nvfp4', block_size=16, scale_mode='absmax')``; a field declared with
  ``metadata={"repr_default": False}`` is shown only when it differs from its default)."""

  name: ClassVar[str]

  def __repr__(self) -> str:
    shown = (
      f for f in dataclasses.fields(self) if f.metadata.get("repr_default", True) or getattr(self, f.name) != f.default
    )
    fields = "".join(f", {f.name}={getattr(self, f.name)!r}" for f in shown)
    return f"{type(self).__name__}(name={self.name!r}{fields})"


@dataclasses.dataclass(frozen=True, repr=False)
class BlockFormat(Format):
  """A block-scaled format: one scale per ``block_size`` consecutive elements along the quantized axis, or per 2D
  tile of ``tile_shapes`` (``QuantizeSpec.block_shape``); partial blocks are zero-padded. The base of
  ``FP4Format`` (E2M1 elements) and ``BlockFP8Format`` (E4M3 elements).

  Attributes:
    block_size: elements per scale along the quantized axis: a positive int.
  """

  block_size: int

  tile_shapes: ClassVar[tuple[tuple[int, int], ...]] = ()
  even_block_size: ClassVar[bool] = False

  def __post_init__(self):
    cls = type(self).__name__
    if isinstance(self.block_size, bool) or not isinstance(self.block_size, int):
      raise TypeError(f"{cls}.block_size must be an int, got {self.block_size!r}")
    if self.block_size <= 0 or (self.even_block_size and self.block_size % 2):
      what = "positive even" if self.even_block_size else "positive"
      raise ValueError(f"{cls}.block_size must be a {what} integer, got {self.block_size}")


@dataclasses.dataclass(frozen=True, repr=False)
class FP4Format(BlockFormat):
  """A block-scaled 4-bit floating-point format: E2M1 elements, one scale per ``block_size`` elements.

  Attributes:
    block_size: elements per scale along the quantized axis (16 for NVFP4, 32 for MXFP4): a positive even int.
    scale_mode: how block scales are chosen, one of the class's ``scale_modes`` (see ``fp4jax.scaling``).

  Class constants (what a subclass defines): ``name``; ``scale_dtype`` (the block scales' dtype); ``scale_modes``;
  ``has_tensor_scale`` (an FP32 per-tensor scale above the block scales); ``gemm_dtype`` (the dtype in which
  ``value · block scale`` is exact, which the GEMM kernels multiply); ``native_block_size`` (the block size of the
  hardware's block-scaled MMA); ``tile_shapes`` (the 2D block shapes the format takes); ``takes_eden`` (whether
  MS-EDEN's scale rule applies to the format with this ``scale_mode``).
  """

  block_size: int
  scale_mode: ScaleMode

  scale_dtype: ClassVar[Any]
  scale_modes: ClassVar[tuple[str, ...]]
  has_tensor_scale: ClassVar[bool]
  gemm_dtype: ClassVar[Any]
  native_block_size: ClassVar[int]
  even_block_size: ClassVar[bool] = True  # E2M1 codes are packed in pairs along the axis

  def __post_init__(self):
    super().__post_init__()
    cls = type(self).__name__
    if self.scale_mode not in self.scale_modes:
      raise ValueError(f"{cls}.scale_mode must be one of {self.scale_modes}, got {self.scale_mode!r}")

  @property
  def takes_eden(self) -> bool:
    return False

  @property
  def needs_block_std(self) -> bool:
    """Whether the block scale rule reads each block's standard deviation (QuEST)."""
    return False

  @property
  def block_scale_candidates(self) -> int:
    """How many block scalings the quantizer rounds each block under before keeping one (1; four-over-six: 2)."""
    return 1

  def tensor_scales(self, amax: jax.Array, rounding: str) -> tuple[jax.Array, jax.Array] | None:
    """``(s_enc, s_dec)``, the fp32 tensor encode / decode scales from the tensor ``amax``; None without one."""
    del amax, rounding
    return None

  def tensor_decode_scale(self, tensor_scales) -> jax.Array:
    """The fp32 decode scale applied after the block scales (``QTensor.global_scale``), from ``tensor_scales``."""
    raise NotImplementedError

  def scale_blocks(self, xb: jax.Array, amax_b: jax.Array, tensor_scales, rounding: str, sigma_b=None):
    """The block scale rule on blocked fp32 ``xb``: ``(scaled, dec, exps, global_scale)`` with ``scaled`` the
    elements ready to round to E2M1, ``dec`` the fp32 block decode scales (keep-dims), ``exps`` their int32
    power-of-two exponents (None where scales are not powers of two) and ``global_scale`` the tensor decode scale.
    ``amax_b``: per-block max|x| (keep-dims); ``sigma_b``: per-block standard deviation where ``needs_block_std``."""
    raise NotImplementedError

  def encode_scales(self, dec: jax.Array, exps: jax.Array | None) -> jax.Array:
    """Block scales in ``scale_dtype`` from ``scale_blocks``' ``dec`` / ``exps`` (NaN -> the NaN pattern)."""
    raise NotImplementedError

  def decode_scales(self, scales: jax.Array) -> jax.Array:
    """Block scales (``scale_dtype``) as exact fp32 values (NaN for the NaN pattern)."""
    raise NotImplementedError

  def scale_bits(self, dec: jax.Array, exps: jax.Array | None) -> jax.Array:
    """``encode_scales`` as uint8 bit patterns by integer arithmetic (no float8 type: kernel-safe)."""
    raise NotImplementedError

  def decode_scale_bits(self, bits: jax.Array) -> jax.Array:
    """``decode_scales`` of uint8 bit patterns by integer arithmetic (kernel-safe)."""
    raise NotImplementedError


@dataclasses.dataclass(frozen=True, repr=False)
class NVFP4Format(FP4Format):
  """NVFP4 (NVIDIA; Transformer Engine's reference quantizer): E4M3 block scales under an FP32 tensor scale.

  ``scale_mode``: ``"absmax"`` (TE) or ``"four_over_six"`` (Quartet II; Four Over Six, Cook et al. arXiv
  2512.02010). Scale rules: ``fp4jax.scaling``; MS-EDEN (``rounding="eden"``) uses its own rule
  (``scaling.nvfp4_rule``) and block target ``V_MAX_EDEN``.

  ``four_over_six_metric``: the block error by which ``"four_over_six"`` keeps the map-to-4 or the map-to-6
  candidate (``fp4jax.quantize.four_over_six_error`` specifies each; a tie keeps 6): ``"mse"`` Σ(x − x̂)²,
  ``"l1"`` Σ|x − x̂| (MAE), ``"max_abs"`` max|x − x̂|. Which references use which: the 4/6 paper's code
  (mit-han-lab/fouroversix, ``ScaleRule``) offers all three with MSE the default; Transformer Engine
  (``NVFP4BlockScaling.nvfp4_4over6_err_mode``, PR #2972) offers MAE (its default) and MSE; Quartet II uses MSE.
  With ``four_over_six_reference="fp4jax"`` (the default) none of them is matched bit for bit: fp4jax dequantizes
  in TE's reference order (``q·dec·s_dec``), rounds ``amax_b·(s_enc/4)`` and sums as specified in ``fp4jax.quantize``.
  Only ``scale_mode="four_over_six"`` takes a metric other than the default ``"mse"``.

  ``four_over_six_reference="te"`` (with ``scale_mode="four_over_six"``, ``four_over_six_metric`` ``"l1"`` (TE's
  default MAE) or ``"mse"``, RTN) chooses blocks as Transformer Engine's 4over6 kernel does, bit for bit (PR #2972
  and #3068, ``transformer_engine/common/cast/nvfp4/quantize_4over6_nvfp4.cuh`` at commit d0067d0d, its default
  path: ``NVTE_NVFP4_4OVER6_E4M3_USE_256`` on, ``NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH`` off), every operation IEEE
  fp32 rounded to nearest-even with subnormals (``fp4jax.ieee``), with ``amax`` the tensor's (or the row's) max|x|
  and ``s_enc = min(1536 / amax, FLT_MAX)`` (1 for amax 0), ``s_dec = 1 / s_enc``::

      base = f32(f32(amax_b / 6) · s_enc)
      dec6 = rne_e4m3(min(base, 448));   dec4 = rne_e4m3(min(f32(base · 1.5), 448))
      enc_t = min(1 / f32(dec_t · s_dec), FLT_MAX);   q_t = rne_e2m1(f32(x · enc_t)) saturating at ±6
      x̂_t = f32(f32(f32(value(q_t) · dec_t) · amax) / 1536);   d = f32(x̂_t − x)
      E_t = (((0 + e_0) + e_1) + …) + e_15 in float32, e_i = |d_i| ("l1") or f32(d_i · d_i) ("mse"), in element
            order along the quantized axis; 16x16 tiles: the 16 row sums added as TE's warp reduction does,
            s_i = r_i + r_{i+8}, then s_i + s_{i+4}, then + s_{i+2}, then + s_{i+1}

  and keeps map-to-4 iff ``E_4 < E_6`` (a tie keeps map-to-6). The map-to-6 candidate is TE's 4over6 one, so its
  scale (``amax_b/6`` first) may differ in the last E4M3 bit from ``scale_mode="absmax"``'s ``amax_b·(s_enc/6)``.
  Stored values follow fp4jax's layout: codes, ``dec_t`` and ``s_dec``, dequantized ``q·dec·s_dec`` (TE's reference
  order; TE's dequantize kernel computes ``q·f32(f32(dec·amax)·f32(1/1536))``). Not offered: TE's 448 bound
  (``nvfp4_4over6_e4m3_use_256="none"``) and its fast-math error path (x̂ rounded to float16 in the E4M3 domain).
  """

  block_size: int = 16
  scale_mode: ScaleMode = "absmax"
  four_over_six_metric: FourOverSixMetric = dataclasses.field(default="mse", metadata={"repr_default": False})
  four_over_six_reference: FourOverSixReference = dataclasses.field(default="fp4jax", metadata={"repr_default": False})

  name: ClassVar[str] = "nvfp4"
  scale_dtype: ClassVar[Any] = jnp.float8_e4m3fn
  scale_modes: ClassVar[tuple[str, ...]] = ("absmax", "four_over_six")
  has_tensor_scale: ClassVar[bool] = True
  gemm_dtype: ClassVar[Any] = jnp.float16  # E2M1 value x E4M3 scale: at most 6 significant bits, in f16's range
  native_block_size: ClassVar[int] = 16
  tile_shapes: ClassVar[tuple[tuple[int, int], ...]] = ((16, 16),)

  def __post_init__(self):
    super().__post_init__()
    metrics = get_args(FourOverSixMetric)
    if self.four_over_six_metric not in metrics:
      raise ValueError(f"NVFP4Format.four_over_six_metric must be one of {metrics}, got {self.four_over_six_metric!r}")
    if self.four_over_six_metric != "mse" and self.scale_mode != "four_over_six":
      raise ValueError(
        f"NVFP4Format.four_over_six_metric={self.four_over_six_metric!r} chooses four-over-six block scales: it "
        f"needs scale_mode='four_over_six', got scale_mode={self.scale_mode!r}"
      )
    self._check_reference()

  def _check_reference(self):
    references = get_args(FourOverSixReference)
    ref = self.four_over_six_reference
    if ref not in references:
      raise ValueError(f"NVFP4Format.four_over_six_reference must be one of {references}, got {ref!r}")
    if ref == "te" and self.scale_mode != "four_over_six":
      raise ValueError(
        "NVFP4Format.four_over_six_reference='te' chooses four-over-six block scales: it needs "
        f"scale_mode='four_over_six', got scale_mode={self.scale_mode!r}"
      )
    if ref == "te" and self.four_over_six_metric not in ("l1", "mse"):
      raise ValueError(
        "NVFP4Format.four_over_six_reference='te' takes four_over_six_metric 'l1' (TE's MAE) or 'mse', got "
        f"{self.four_over_six_metric!r}"
      )

  @property
  def takes_eden(self) -> bool:
    return self.scale_mode == "absmax"

  @property
  def block_scale_candidates(self) -> int:
    return 2 if self.scale_mode == "four_over_six" else 1

  def scale_rule(self, rounding: str) -> str:
    """The tensor/block scale rule: MS-EDEN's for ``rounding="eden"``, else ``scale_mode``."""
    return scaling.nvfp4_rule(self.scale_mode, rounding)

  def tensor_scales(self, amax: jax.Array, rounding: str) -> tuple[jax.Array, jax.Array]:
    return scaling.nvfp4_tensor_scales(amax, self.scale_rule(rounding))

  def tensor_decode_scale(self, tensor_scales) -> jax.Array:
    return tensor_scales[1]

  def block_scales(self, amax_b: jax.Array, tensor_scales, target: float) -> tuple[jax.Array, jax.Array]:
    """``(dec_b, enc_b)`` mapping ``amax_b`` to ``target`` (``scaling.nvfp4_block_scales``)."""
    return scaling.nvfp4_block_scales(amax_b, *tensor_scales, target)

  def scale_blocks(self, xb, amax_b, tensor_scales, rounding, sigma_b=None):
    del sigma_b
    target = scaling.V_MAX_EDEN if self.scale_rule(rounding) == "eden" else E2M1_MAX
    dec, enc = self.block_scales(amax_b, tensor_scales, target)
    return mul_unflushed(xb, enc), dec, None, tensor_scales[1]

  def encode_scales(self, dec, exps):
    del exps
    nan = lax.bitcast_convert_type(jnp.uint8(E4M3_NAN_BITS), jnp.float8_e4m3fn)
    return jnp.where(jnp.isnan(dec), nan, dec.astype(jnp.float8_e4m3fn))  # dec lies on the E4M3 grid: exact

  def decode_scales(self, scales):
    return scales.astype(jnp.float32)

  def scale_bits(self, dec, exps):
    del exps
    return e4m3_bits(dec)

  def decode_scale_bits(self, bits):
    return e4m3_bits_to_f32(bits)


@dataclasses.dataclass(frozen=True, repr=False)
class MXFP4Format(FP4Format):
  """MXFP4 (OCP MX v1.0): power-of-two ``float8_e8m0fnu`` block scales 2^e, no tensor scale.

  ``scale_mode``: ``"floor"`` (OCP), ``"rceil"``, ``"quest"`` / ``"quest_nearest"`` (Quartet forward) or
  ``"floor_headroom"`` (Quartet backward: elements pre-scaled by 3/4, the 4/3 returned as the tensor decode scale);
  the exponent rules are ``scaling.mx_exponents``.
  """

  block_size: int = 32
  scale_mode: ScaleMode = "floor"

  name: ClassVar[str] = "mxfp4"
  scale_dtype: ClassVar[Any] = jnp.float8_e8m0fnu
  scale_modes: ClassVar[tuple[str, ...]] = ("floor", "rceil", "quest", "quest_nearest", "floor_headroom")
  has_tensor_scale: ClassVar[bool] = False
  gemm_dtype: ClassVar[Any] = jnp.bfloat16  # E2M1 value x 2^e: E8M0's range needs bf16's exponent
  native_block_size: ClassVar[int] = 32

  @property
  def needs_block_std(self) -> bool:
    return self.scale_mode in ("quest", "quest_nearest")

  def tensor_decode_scale(self, tensor_scales) -> jax.Array:
    del tensor_scales
    return jnp.float32(1.0 / scaling.mx_element_prescale(self.scale_mode))

  def scale_blocks(self, xb, amax_b, tensor_scales, rounding, sigma_b=None):
    del rounding
    exps = scaling.mx_exponents(amax_b, self.scale_mode, sigma_b)
    pre = scaling.mx_element_prescale(self.scale_mode)
    # x · pre · 2^-e rounded once: pre = 1, or 3/4 = 3 · 2^-2
    scaled = mul_pow2_rn_f32(xb, -exps) if pre == 1.0 else mul_pow2_rn(xb, jnp.int32(-2) - exps, 3)
    return scaled, pow2(exps), exps, self.tensor_decode_scale(tensor_scales)

  def encode_scales(self, dec, exps):
    return lax.bitcast_convert_type(self.scale_bits(dec, exps), jnp.float8_e8m0fnu)

  def decode_scales(self, scales):
    b = lax.bitcast_convert_type(scales, jnp.uint8).astype(jnp.int32)
    return jnp.where(b == E8M0_NAN_BITS, jnp.float32(jnp.nan), pow2(b - E8M0_BIAS))

  def scale_bits(self, dec, exps):
    return jnp.where(jnp.isnan(dec), E8M0_NAN_BITS, exps + E8M0_BIAS).astype(jnp.uint8)

  def decode_scale_bits(self, bits):
    return e8m0_bits_to_f32(bits)


@dataclasses.dataclass(frozen=True, repr=False)
class FP8Format(Format):
  """An OCP FP8 element format with per-tensor current scaling (``fp4jax.fp8``): ``exponent_bits`` and
  ``mantissa_bits`` (summing to 7), ``max`` its largest finite value; ``name`` is ``"fp8_e{E}m{M}"``.

  Rounding (``round``): ``x`` clipped to ±max, then ``round_half_even(x · 2^-e) · 2^e`` with ``2^e`` the grid
  spacing at ``|x|``, ``e = max(floor(log2|x|), emin) - mantissa_bits`` read from the float32 exponent field (both
  scalings exact; NaN stays NaN).
  """

  exponent_bits: int
  mantissa_bits: int
  max: float

  def __post_init__(self):
    for field in ("exponent_bits", "mantissa_bits"):
      v = getattr(self, field)
      if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"FP8Format.{field} must be a positive int, got {v!r}")
    if self.exponent_bits + self.mantissa_bits != 7:
      raise ValueError(
        f"FP8Format: exponent_bits + mantissa_bits must be 7, got {self.exponent_bits} + {self.mantissa_bits}"
      )
    if not 0 < self.max < 2.0 ** (2 ** (self.exponent_bits - 1) + 1):
      raise ValueError(f"FP8Format.max must be a positive finite value of the format, got {self.max!r}")
    spacing_exp = max(math.frexp(self.max)[1] - 1, self.emin) - self.mantissa_bits  # the grid spacing at max: 2^e
    if math.ldexp(self.max, -spacing_exp) % 1:
      raise ValueError(
        f"FP8Format.max must lie on the E{self.exponent_bits}M{self.mantissa_bits} grid (a multiple of "
        f"2^{spacing_exp} at its magnitude), got {self.max!r}"
      )

  @property
  def name(self) -> str:  # derived from the fields: a replace() cannot relabel it
    return f"fp8_e{self.exponent_bits}m{self.mantissa_bits}"

  @property
  def emin(self) -> int:
    """Exponent of the smallest normal value, ``2 - 2^(exponent_bits - 1)``."""
    return 2 - 2 ** (self.exponent_bits - 1)

  def round(self, x: jax.Array) -> jax.Array:
    """Float32 ``x`` rounded to the grid, nearest-even, saturated to ±max (see the class docstring)."""
    x = jnp.clip(x.astype(jnp.float32), -self.max, self.max)
    biased = (lax.bitcast_convert_type(x, jnp.int32) >> 23) & 0xFF
    e = jnp.maximum(biased - 127, self.emin) - self.mantissa_bits
    return jnp.round(x * pow2(-e)) * pow2(e)


E4M3 = FP8Format(exponent_bits=4, mantissa_bits=3, max=448.0)
E5M2 = FP8Format(exponent_bits=5, mantissa_bits=2, max=57344.0)


def _block_max_bits(xb: jax.Array, axes: tuple[int, ...]) -> jax.Array:
  """Per-block max of the magnitude bits of float32 ``xb`` (keep-dims int32): an integer max, so no backend drops
  a NaN or flushes a subnormal; a block is non-finite iff it reaches +Inf's bits."""
  return jnp.max(lax.bitcast_convert_type(xb, jnp.int32) & 0x7FFFFFFF, axis=axes, keepdims=True)


@dataclasses.dataclass(frozen=True, repr=False)
class BlockFP8Format(BlockFormat):
  """Block-scaled FP8: E4M3 elements (``element``), one scale per block along the quantized axis, no tensor scale.

  Quantizing a block (``quantize_blocks``), all in float32: ``amax_b = max|x|`` over the block (zero padding
  included), a block decode scale ``dec_b`` from it (the subclass's rule), the element ``v = rne_e4m3(sat(x /
  dec_b))`` (nearest, ties to even, clamped to ±448 first), dequantized ``f32(v · dec_b)``. A block holding NaN
  or ±Inf gets a NaN scale and NaN elements (OCP MX v1.0: a NaN scale makes the whole block NaN; E4M3 has no Inf),
  so NaN and Inf never become finite. Subnormal inputs and scales count at their IEEE value on every backend
  (integer arithmetic on the float32 bits; ``fp4jax.ieee``).

  Class constants: ``name``; ``element`` (the ``FP8Format`` of the elements); ``scale_dtype`` (the stored block
  scales); ``gemm_dtype`` (a dtype in which ``v · dec_b`` is exact, which a GEMM multiplies).
  """

  element: ClassVar[FP8Format] = E4M3
  scale_dtype: ClassVar[Any]
  gemm_dtype: ClassVar[Any]

  def scale_blocks(self, xb: jax.Array, amax_b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(scaled, dec)``: the elements ``x / dec_b`` (float32, exact where ``dec_b`` is a power of two) and the
    fp32 block decode scales (keep-dims) for the blocks' finite ``amax_b``."""
    raise NotImplementedError

  def quantize_blocks(self, xb: jax.Array, axes: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """``(v, dec)``: blocked float32 ``xb`` (blocks along ``axes``) as E4M3 grid values (float32) and the fp32
    block decode scales (keep-dims); NaN for both in a non-finite block (see the class docstring)."""
    amax_bits = _block_max_bits(xb, axes)
    nonfinite = amax_bits >= F32_INF_BITS
    scaled, dec = self.scale_blocks(xb, lax.bitcast_convert_type(amax_bits, jnp.float32))
    nan = jnp.float32(jnp.nan)
    return jnp.where(nonfinite, nan, self.element.round(scaled)), jnp.where(nonfinite, nan, dec)

  def dequantize_blocks(self, v: jax.Array, dec: jax.Array) -> jax.Array:
    """``f32(v · dec_b)`` rounded once, subnormal products kept on every backend (``fp4jax.ieee.mul_short_rn``:
    ``v`` has at most 4 significant bits); NaN where either is NaN."""
    return mul_short_rn(v, dec)

  def encode_scales(self, dec: jax.Array) -> jax.Array:
    """Block decode scales (fp32, from ``quantize_blocks``) as stored, in ``scale_dtype``."""
    raise NotImplementedError

  def decode_scales(self, scales: jax.Array) -> jax.Array:
    """Stored block scales (``scale_dtype``) as exact fp32 values (NaN for NaN)."""
    raise NotImplementedError


MXScaleMode = Literal["floor", "rceil"]


@dataclasses.dataclass(frozen=True, repr=False)
class MXFP8Format(BlockFP8Format):
  """MXFP8 (OCP Microscaling Formats (MX) v1.0, E4M3 elements): one power-of-two ``float8_e8m0fnu`` scale 2^e per
  ``block_size`` (32) consecutive elements along the quantized axis.

  Scale exponent, exact from the float32 bits of ``amax_b`` (subnormals included), clipped to E8M0's [-127, 127]:

  * ``"floor"`` (OCP MX v1.0 §6.3): ``e = floor(log2 amax_b) - emax_elem``, ``emax_elem = 8`` for E4M3 (448 =
    1.75 · 2^8); ``amax_b / 2^e`` lies in [256, 512), so elements above 448 saturate to ±448.
  * ``"rceil"`` (round the scale up: NVIDIA's MXFP8 recipe, Mishra et al. arXiv 2506.08027; Transformer Engine's
    MXFP8 quantizer): the smallest ``e`` with ``448 · 2^e >= amax_b``, i.e. ``floor(log2 amax_b) - 8``, plus 1 where
    amax_b's significand exceeds 1.75; nothing saturates.

  An all-zero block gets e = -127 (its elements are 0). Elements: ``rne_e4m3(sat(x · 2^-e))``, the product rounded
  once (``fp4jax.ieee.mul_pow2_rn``). A block holding NaN or ±Inf gets the NaN scale 0xFF and NaN elements.

  Attributes:
    block_size: elements per scale (32, the OCP block).
    scale_mode: ``"floor"`` (OCP, the default) or ``"rceil"``.
  """

  block_size: int = 32
  scale_mode: MXScaleMode = "floor"

  name: ClassVar[str] = "mxfp8_e4m3"
  scale_dtype: ClassVar[Any] = jnp.float8_e8m0fnu
  gemm_dtype: ClassVar[Any] = jnp.bfloat16  # E4M3 value x 2^e: 4 significant bits, E8M0's range needs bf16's exponent
  scale_modes: ClassVar[tuple[str, ...]] = ("floor", "rceil")

  def __post_init__(self):
    super().__post_init__()
    if self.scale_mode not in self.scale_modes:
      raise ValueError(f"MXFP8Format.scale_mode must be one of {self.scale_modes}, got {self.scale_mode!r}")

  def exponents(self, amax_b: jax.Array) -> jax.Array:
    """int32 E8M0 exponents of the blocks' finite ``amax_b`` by ``scale_mode`` (class docstring)."""
    emax = math.frexp(self.element.max)[1] - 1  # 8: floor(log2 448)
    e = floor_log2(amax_b) - emax
    if self.scale_mode == "rceil":
      max_significand = int(math.ldexp(self.element.max, 23 - emax))  # 1.75 · 2^23
      e = e + (significand(amax_b)[1] > max_significand).astype(jnp.int32)
    zero = lax.bitcast_convert_type(amax_b, jnp.int32) == 0
    return jnp.where(zero, jnp.int32(-E8M0_BIAS), jnp.clip(e, -E8M0_BIAS, E8M0_BIAS)).astype(jnp.int32)

  def scale_blocks(self, xb, amax_b):
    e = self.exponents(amax_b)
    return mul_pow2_rn_f32(xb, -e), pow2(e)

  def encode_scales(self, dec):
    bits = jnp.where(jnp.isnan(dec), E8M0_NAN_BITS, floor_log2(dec) + E8M0_BIAS).astype(jnp.uint8)
    return lax.bitcast_convert_type(bits, jnp.float8_e8m0fnu)

  def decode_scales(self, scales):
    return e8m0_bits_to_f32(lax.bitcast_convert_type(scales, jnp.uint8))


@dataclasses.dataclass(frozen=True, repr=False)
class FP8BlockFormat(BlockFP8Format):
  """FP8 block scaling (DeepSeek-V3, arXiv 2412.19437 §3.3.1; Transformer Engine's ``Float8BlockScaling``): E4M3
  elements, one float32 scale per 1 x ``block_size`` tile along the quantized axis (``block_shape=None``:
  activations and gradients, per token and 128 channels) or per ``block_size`` x ``block_size`` block
  (``block_shape=(128, 128)``: weights).

  Block decode scale ``dec_b = f32(amax_b / 448)`` (correctly rounded, ``fp4jax.ieee.div_rn``; a subnormal quotient
  kept), elements ``rne_e4m3(sat(f32(x / dec_b)))`` (the division correctly rounded, then one E4M3 rounding), as
  DeepSeek-V3's released kernel (``s = amax / 448; y = x / s``). An all-zero block gets ``dec_b = 1``; a block
  whose quotient underflows to 0 (amax_b <= 224 · 2^-149) gets the smallest positive float32 2^-149. A block
  holding NaN or ±Inf gets a NaN scale and NaN elements.

  Attributes:
    block_size: the tile length along the quantized axis and the side of the 2D weight blocks (128).
  """

  block_size: int = 128

  name: ClassVar[str] = "fp8_e4m3_block"
  scale_dtype: ClassVar[Any] = jnp.float32
  gemm_dtype: ClassVar[Any] = jnp.float32  # E4M3 value x an fp32 scale: up to 28 significant bits

  @property
  def tile_shapes(self) -> tuple[tuple[int, int], ...]:
    return ((self.block_size, self.block_size),)

  def scale_blocks(self, xb, amax_b):
    dec = div_rn(amax_b, jnp.float32(self.element.max))
    dec_bits = lax.bitcast_convert_type(dec, jnp.int32)  # bit tests: a float compare may flush subnormals
    dec = jnp.where(dec_bits == 0, lax.bitcast_convert_type(jnp.int32(1), jnp.float32), dec)
    dec = jnp.where(lax.bitcast_convert_type(amax_b, jnp.int32) == 0, jnp.float32(1.0), dec)
    return div_rn(xb, dec), dec

  def encode_scales(self, dec):
    return dec.astype(jnp.float32)

  def decode_scales(self, scales):
    return scales.astype(jnp.float32)


@dataclasses.dataclass(frozen=True, repr=False)
class E2M1ChannelFormat(Format):
  """E2M1 with one absmax scale per row along the contraction axis (Microsoft FP4, ``fp4jax.operand``): per token
  for activations, per output channel for weights; ``max`` is the largest E2M1 magnitude."""

  name: ClassVar[str] = "e2m1_channel"
  max: ClassVar[float] = E2M1_MAX


NVFP4 = NVFP4Format()
MXFP4 = MXFP4Format()
MXFP8 = MXFP8Format()
FP8_BLOCK = FP8BlockFormat()
E2M1_CHANNEL = E2M1ChannelFormat()
FORMATS: tuple[Format, ...] = (NVFP4, MXFP4, E4M3, E5M2, E2M1_CHANNEL, MXFP8, FP8_BLOCK)


def get(name: str) -> Format:
  """The format instance called ``name`` (for files and command lines).

  Args:
    name: a format's ``name``, one of those in ``FORMATS``.

  Returns:
    The ``Format`` instance of that name.

  Raises:
    ValueError: no format has that name (the message lists the names).
  """
  for fmt in FORMATS:
    if fmt.name == name:
      return fmt
  raise ValueError(f"unknown format {name!r}; expected one of {[f.name for f in FORMATS]}")
