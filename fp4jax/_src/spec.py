"""``QuantizeSpec``: how one tensor is quantized, as one frozen (hashable) dataclass validated in its constructor.

``fp4jax.quantize`` / ``fp4jax.fake_quantize`` take it (their keyword form builds one: ``QuantizeSpec.of``), a
recipe's operands are ``fp4jax.recipes.OperandSpec``, a subclass adding the GEMM-role fields, and the fused quantize
kernels take it too (what they write, and in which layout, is their separate ``KernelOutput``). The axis the tensor
is quantized along and the random key are arguments of the call, not of the spec.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np

from fp4jax._src import hadamard as hadamard_lib
from fp4jax._src.formats import BlockFormat, E2M1ChannelFormat, Format, FP4Format, FP8Format

Rounding = Literal["rtn", "sr", "eden"]
Signs = Literal["none", "te", "fixed", "random"]
Clip = Literal["none", "occ"]
AmaxScope = Literal["tensor", "row"]
FIXED_SIGNS_SEED = 0x5EED5
EDEN_HADAMARD = 128


def _is_int(v) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _one_of(owner: str, field: str, value, options: tuple) -> None:
  if value not in options:
    raise ValueError(f"{owner}.{field} must be one of {options}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class QuantizeSpec:
  """How a tensor is quantized (along an axis the caller gives: a GEMM's contraction axis for recipe operands).

  Attributes:
    fmt: ``None`` (not quantized: kept at its input precision; recipes only) or a format object
      (``fp4jax.formats``): an ``FP4Format`` (block-scaled ``NVFP4`` / ``MXFP4``, ``fp4jax.quantize``), ``E4M3`` /
      ``E5M2`` (FP8 with per-tensor current scaling, ``fp4jax.fp8``), a ``BlockFP8Format`` (block-scaled E4M3:
      ``MXFP8``, ``FP8_BLOCK``; ``fp4jax.fp8.quantize_blocks``) or ``E2M1_CHANNEL`` (E2M1 with one absmax scale
      per row along the quantized axis; Microsoft FP4).
    block_shape: ``None`` (1D blocks of ``fmt.block_size``; ``(fmt.block_size,)`` is stored as ``None``) or one of
      ``fmt.tile_shapes`` (2D tiles of the last two dims: NVFP4 ``(16, 16)``, FP8_BLOCK ``(128, 128)``). A tuple
      of ints, never a bare int.
    rounding: ``"rtn"`` (nearest, ties to even), ``"sr"`` (stochastic, unbiased) or ``"eden"`` (MS-EDEN: RTN plus a
      stochastically rounded scale correction; NVFP4 1D blocks). FP8 and ``E2M1_CHANNEL`` take ``"rtn"`` only; a
      ``"four_over_six"`` ``scale_mode`` chooses scales by RTN error, so it takes ``"rtn"`` only.
    hadamard: blockwise Hadamard size along the quantized axis applied before quantizing (0: none), one of
      ``fp4jax.hadamard.SIZES``.
    signs: the Hadamard sign vector: ``"none"``, ``"te"`` (Transformer Engine's 16, needs ``hadamard=16``),
      ``"fixed"`` (one constant random vector, from the seed ``FIXED_SIGNS_SEED``) or ``"random"`` (drawn from the
      call's key). With ``hadamard=0`` no signs are applied (``"te"`` is still refused there).
    scale_pow2: power-of-two scales for FP8 / ``E2M1_CHANNEL`` (``2^floor(log2 γ)``); the FP4 formats choose their
      scales by ``fmt.scale_mode`` instead.
    clip: ``"occ"``: clamp to the [1 - q, q] quantiles before quantizing and add the clamped-off residual back at
      high precision (Microsoft FP4's outlier clamping and compensation; a GEMM operand transform).
    clip_quantile: q for ``"occ"``, in (0.5, 1].
    amax: what the tensor-wide statistic is taken over: ``"tensor"`` (Transformer Engine's design: NVFP4's FP32
      tensor scale and FP8's current scale from max|x| over the whole tensor) or ``"row"`` (one per row along the
      quantized axis, from that row's max|x|; the row is quantized exactly as the 1-row tensor would be). MXFP4 and
      ``E2M1_CHANNEL`` take no tensor-wide statistic, so both give the same bits there. ``"row"`` needs a
      quantized ``fmt`` and 1D blocks.

  Raises:
    TypeError: a field of the wrong type (``fmt`` not a format object, ``block_shape`` not a tuple of ints,
      ``hadamard`` not an int, ``scale_pow2`` not a bool), naming the field.
    ValueError: a value outside the field's options, or a combination the format does not take, naming the field
      and what it expects.
  """

  fmt: Format | None = None
  block_shape: tuple[int, ...] | None = None
  rounding: Rounding = "rtn"
  hadamard: int = 0
  signs: Signs = "none"
  scale_pow2: bool = False
  clip: Clip = "none"
  clip_quantile: float = 0.99
  amax: AmaxScope = "tensor"

  def __post_init__(self):
    owner = type(self).__name__
    fmt = self.fmt
    if not (fmt is None or isinstance(fmt, Format)):
      raise TypeError(
        f"{owner}.fmt must be None or a format object: fp4jax.formats.NVFP4, MXFP4, E4M3, E5M2, "
        f"E2M1_CHANNEL, MXFP8, FP8_BLOCK (or a variant of one); got {fmt!r} of type {type(fmt).__name__}"
      )
    object.__setattr__(self, "block_shape", self._checked_block_shape(owner))
    _one_of(owner, "rounding", self.rounding, get_args(Rounding))
    if self.rounding != "rtn" and not isinstance(fmt, FP4Format):
      raise ValueError(f"{owner}.rounding={self.rounding!r} needs an FP4Format fmt, got {fmt!r}")
    if self.rounding == "eden" and (not fmt.takes_eden or self.block_shape is not None):
      raise ValueError(
        f"{owner}.rounding='eden' is MS-EDEN for NVFP4 1x16 blocks: fmt must be fp4jax.NVFP4 (a scale_mode that "
        f"takes it) with block_shape None; got fmt={fmt!r}, block_shape={self.block_shape}"
      )
    if isinstance(fmt, FP4Format) and fmt.scale_mode == "four_over_six" and self.rounding != "rtn":
      raise ValueError(
        f"{owner}.rounding must be 'rtn' with scale_mode 'four_over_six' (it chooses scales by RTN error), "
        f"got {self.rounding!r}"
      )
    if not _is_int(self.hadamard):
      raise TypeError(f"{owner}.hadamard must be an int (0: none), got {self.hadamard!r}")
    object.__setattr__(self, "hadamard", int(self.hadamard))
    if self.hadamard:
      hadamard_lib.check_size(self.hadamard, f"{owner}.hadamard")
    _one_of(owner, "signs", self.signs, get_args(Signs))
    if self.signs == "te" and self.hadamard != 16:
      raise ValueError(
        f"{owner}.signs='te' is Transformer Engine's 16-point vector: it needs hadamard=16, got {self.hadamard}"
      )
    if not isinstance(self.scale_pow2, bool):
      raise TypeError(f"{owner}.scale_pow2 must be a bool, got {self.scale_pow2!r}")
    if self.scale_pow2 and not isinstance(fmt, (FP8Format, E2M1ChannelFormat)):
      raise ValueError(
        f"{owner}.scale_pow2 applies to FP8 / E2M1_CHANNEL formats (FP4 formats choose scales by their "
        f"scale_mode), got fmt={fmt!r}"
      )
    _one_of(owner, "clip", self.clip, get_args(Clip))
    if not 0.5 < self.clip_quantile <= 1.0:
      raise ValueError(f"{owner}.clip_quantile must be in (0.5, 1], got {self.clip_quantile}")
    _one_of(owner, "amax", self.amax, get_args(AmaxScope))
    if self.amax == "row" and (fmt is None or self.block_shape is not None):
      raise ValueError(
        f"{owner}.amax='row' needs a quantized fmt with 1D blocks (one scale per row), got "
        f"fmt={fmt!r}, block_shape={self.block_shape}"
      )

  def _checked_block_shape(self, owner: str) -> tuple[int, int] | None:
    """``block_shape`` validated against ``fmt``: None, or a 2D tile shape the format takes."""
    bs, fmt = self.block_shape, self.fmt
    if bs is None:
      return None
    if not isinstance(bs, (tuple, list)) or not all(_is_int(b) for b in bs):
      raise TypeError(f"{owner}.block_shape must be None or a tuple of ints such as (16,) or (16, 16), got {bs!r}")
    bs = tuple(int(b) for b in bs)
    if not isinstance(fmt, BlockFormat):
      raise ValueError(f"{owner}.block_shape applies to block-scaled fmts (BlockFormat) only, got fmt={fmt!r}")
    if len(bs) == 1:
      if bs[0] != fmt.block_size:
        raise ValueError(f"{owner}.block_shape {bs} must match the format's block size {fmt.block_size}")
      return None
    if len(bs) != 2:
      raise ValueError(f"{owner}.block_shape must be (block,) or a 2D tile such as (16, 16), got {bs}")
    if bs not in fmt.tile_shapes:
      raise ValueError(
        f"{owner}.block_shape {bs}: {fmt!r} takes the 2D blocks {fmt.tile_shapes} (NVFP4: (16, 16); FP8_BLOCK: "
        "(128, 128))"
      )
    return bs

  @classmethod
  def of(
    cls,
    fmt: FP4Format,
    *,
    rounding: Rounding = "rtn",
    block_shape: tuple[int, ...] | None = None,
    hadamard: int | Literal["auto"] | None = "auto",
    hadamard_signs: Signs = "random",
  ) -> QuantizeSpec:
    """The spec of ``fp4jax.quantize``'s keyword form (its defaults).

    Args:
      fmt: an ``FP4Format`` (``fp4jax.NVFP4``, ``fp4jax.MXFP4`` or a variant).
      rounding: as ``QuantizeSpec.rounding``.
      block_shape: as ``QuantizeSpec.block_shape``.
      hadamard: the Hadamard size, 0 or None for none; ``"auto"`` is ``EDEN_HADAMARD`` (128, MS-EDEN's rotation) for
        ``rounding="eden"`` and none otherwise.
      hadamard_signs: as ``QuantizeSpec.signs``; dropped (``"none"``) when there is no Hadamard.

    Returns:
      The ``QuantizeSpec``.

    Raises:
      TypeError, ValueError: as the constructor, naming the field; ``fmt`` not an ``FP4Format``.
    """
    if not isinstance(fmt, FP4Format):
      raise TypeError(
        f"fmt must be an FP4Format such as fp4jax.NVFP4 or fp4jax.MXFP4 (a format object, not a name), or a "
        f"QuantizeSpec; got {fmt!r}"
      )
    if hadamard == "auto":
      hadamard = EDEN_HADAMARD if rounding == "eden" else 0
    hadamard = 0 if hadamard is None else hadamard
    _one_of(cls.__name__, "signs", hadamard_signs, get_args(Signs))
    signs = hadamard_signs if hadamard else "none"
    return cls(fmt, block_shape=block_shape, rounding=rounding, hadamard=hadamard, signs=signs)

  @property
  def is_random(self) -> bool:
    """True when quantizing draws from the call's key: SR, MS-EDEN or fresh random Hadamard signs."""
    return self.rounding in ("sr", "eden") or (self.hadamard > 0 and self.signs == "random")

  def sign_vector(self, key: jax.Array | None) -> jax.Array | None:
    """The Hadamard's ±1 sign vector: None (no Hadamard or no signs), TE's 16, the fixed vector, or from ``key``."""
    if not self.hadamard or self.signs == "none":
      return None
    if self.signs == "te":
      return jnp.asarray(hadamard_lib.TE_SIGNS_16)
    if self.signs == "fixed":
      return hadamard_lib.random_signs(jax.random.key(FIXED_SIGNS_SEED), self.hadamard)
    return hadamard_lib.random_signs(key, self.hadamard)
