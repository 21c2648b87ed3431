"""``QuantizeSpec``: what a fused quantize kernel computes (frozen, hashable: a static argument under ``jit``), and
``Quantized``: what it returns."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fp4jax._src.formats import FP4Format
from fp4jax._src.quantize import QTensor
from fp4jax._src.spec import QuantizeSpec as Quantizer

ALONG = ("rows", "cols", "rows_of_transpose")
DEQUANTIZE = ("with_tensor_scale", "block_scaled_only")


@dataclasses.dataclass(frozen=True)
class QuantizeSpec:
  """A 2D quantization, in ``fp4jax.quantize`` terms.

  Attributes:
    fmt: ``fp4jax.NVFP4`` / ``fp4jax.MXFP4`` (or a ``dataclasses.replace`` of them, e.g. four-over-six).
    rounding: ``"rtn"``, ``"sr"`` or ``"eden"`` (MS-EDEN).
    hadamard: blockwise Hadamard size along the quantized axis (0: none; 128 is MS-EDEN's rotation).
    hadamard_signs: ``"te"``, ``"random"`` (drawn from the key, or passed to the kernel as ``signs``) or ``"none"``.
    block_shape: None (1D blocks of ``fmt.block_size``) or ``(16, 16)`` (NVFP4 2D tiles).
    along: ``"rows"`` quantizes along the last axis (``fp4jax.quantize(x, axis=-1)``). The other two quantize
      along axis 0 and write the result transposed, contiguous along the quantized axis (the K-major operand of
      the weight-gradient GEMM, without a transpose pass); they differ only in how random bits are indexed:
      ``"cols"`` is ``fp4jax.quantize(x, axis=0)`` (bits of ``x``'s row-major indices), ``"rows_of_transpose"`` is
      ``fp4jax.quantize(x.T, axis=-1)`` (bits of ``xᵀ``'s row-major indices: what ``fp4jax.dot_general``'s
      XLA path draws for the operands it transposes).
    dequantize: None, or also write the dequantized tensor in the Hadamard domain: ``"with_tensor_scale"``
      (``fake_quantize(..., rotated=True)``, ``f32(value(q)·dec_b)·s_dec`` in ``x.dtype``) or
      ``"block_scaled_only"`` (``value(q)·dec_b`` without the tensor scale, in bfloat16, where it is exact: what
      ``fp4jax.operand`` multiplies in its GEMMs).
    trust_mask: also write QuEST's trust mask (uint8, 1 where ``|x̂| < 6·dec_b·s_dec``, ``fp4jax.estimators``).
    packed: write the packed codes and block scales (the ``QTensor``). False writes only what ``dequantize`` and
      ``trust_mask`` ask for: a GEMM on the bf16 values (``fp4jax.operand`` on Hopper) needs nothing else, and the
      kernel then moves 0.56 bytes per element less.
  """

  fmt: FP4Format
  rounding: str = "rtn"
  hadamard: int = 0
  hadamard_signs: str = "none"
  block_shape: tuple[int, int] | None = None
  along: str = "rows"
  dequantize: str | None = None
  trust_mask: bool = False
  packed: bool = True

  def __post_init__(self):
    self.quantizer  # noqa: B018 (validates fmt, rounding, block_shape, hadamard and signs, naming the field)
    if self.along not in ALONG:
      raise ValueError(f"QuantizeSpec.along must be one of {ALONG}, got {self.along!r}")
    if self.block_shape is not None and tuple(self.block_shape) != (16, 16):
      raise ValueError(f"QuantizeSpec.block_shape must be None or (16, 16), got {self.block_shape}")
    if self.rounding == "eden" and self.hadamard == 0:
      raise ValueError("QuantizeSpec: rounding='eden' is MS-EDEN with its rotation; set hadamard=128")
    if self.dequantize is not None and self.dequantize not in DEQUANTIZE:
      raise ValueError(f"QuantizeSpec.dequantize must be None or one of {DEQUANTIZE}, got {self.dequantize!r}")
    if not self.packed and self.dequantize is None:
      raise ValueError("QuantizeSpec(packed=False) writes only the dequantized tensor: set dequantize too")

  def check_signs(self, signs) -> None:
    """An explicit Hadamard sign vector replaces the draw of random signs: ``hadamard_signs="random"``, shape
    ``(hadamard,)``; ValueError naming ``signs`` otherwise."""
    if self.hadamard_signs != "random":
      raise ValueError(
        f"signs: an explicit sign vector replaces the random draw; it needs hadamard_signs='random', "
        f"got {self.hadamard_signs!r}"
      )
    if jnp.shape(signs) != (self.hadamard,):
      raise ValueError(f"signs must have shape ({self.hadamard},) (one per Hadamard point), got {jnp.shape(signs)}")

  @property
  def quantizer(self) -> Quantizer:
    """The quantizer as ``fp4jax.QuantizeSpec`` (what ``fp4jax.quantize`` takes; signs dropped without Hadamard)."""
    signs = self.hadamard_signs if self.hadamard else "none"
    return Quantizer(self.fmt, self.block_shape, self.rounding, self.hadamard, signs)

  @property
  def transposed(self) -> bool:
    """Blocks run along axis 0 of ``x`` and the outputs are written transposed (K-major)."""
    return self.along != "rows"

  @property
  def axis(self) -> int:
    """The axis of ``x`` the blocks run along."""
    return 0 if self.transposed else -1

  @property
  def block(self) -> int:
    return self.fmt.block_size

  @property
  def unit(self) -> int:
    """Elements that must stay together along the quantized axis: a block, or a Hadamard chunk when larger."""
    return max(self.block, self.hadamard or 1)

  @property
  def quantize_kwargs(self) -> dict:
    """Keyword arguments that make ``fp4jax.quantize`` compute this spec (on ``x``, or ``x.T`` for
    ``along="rows_of_transpose"``)."""
    return dict(
      axis=0 if self.along == "cols" else -1,
      rounding=self.rounding,
      block_shape=self.block_shape,
      hadamard=self.hadamard or None,
      hadamard_signs=self.hadamard_signs,
    )


class Quantized(NamedTuple):
  """What a fused quantize returns: the ``QTensor`` (None unless ``spec.packed``), the optional outputs
  ``QuantizeSpec`` asks for (or None), and the tensor's fp32 decode scale (``QTensor.global_scale``)."""

  qtensor: QTensor | None
  dequantized: jax.Array | None
  trust_mask: jax.Array | None
  global_scale: jax.Array
