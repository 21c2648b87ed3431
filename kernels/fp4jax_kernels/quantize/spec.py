"""``QuantizeSpec``: what a fused quantize kernel computes (frozen, hashable: a static argument under ``jit``)."""

from __future__ import annotations

import dataclasses

from fp4jax.formats import FP4Format

ALONG = ("rows", "cols")


@dataclasses.dataclass(frozen=True)
class QuantizeSpec:
  """A 2D quantization, in ``fp4jax.quantize`` terms.

  Attributes:
    fmt: ``fp4jax.NVFP4`` / ``fp4jax.MXFP4`` (or a ``dataclasses.replace`` of them, e.g. four-over-six).
    rounding: ``"rtn"``, ``"sr"`` or ``"eden"`` (MS-EDEN).
    hadamard: blockwise Hadamard size along the quantized axis (0: none; 128 is MS-EDEN's rotation).
    hadamard_signs: ``"te"``, ``"random"`` or ``"none"``.
    block_shape: None (1D blocks of ``fmt.block_size``) or ``(16, 16)`` (NVFP4 2D tiles).
    along: ``"rows"`` quantizes along the last axis (``fp4jax.quantize(x, axis=-1)``); ``"cols"`` along axis 0
      (``fp4jax.quantize(x, axis=0)``, same random bits) and writes the result transposed, contiguous along the
      quantized axis: the K-major operand of the weight-gradient GEMM, without a transpose pass.
    dequantize: also write the dequantized tensor (in the Hadamard domain, ``fake_quantize(..., rotated=True)``).
  """

  fmt: FP4Format
  rounding: str = "rtn"
  hadamard: int = 0
  hadamard_signs: str = "none"
  block_shape: tuple[int, int] | None = None
  along: str = "rows"
  dequantize: bool = False

  def __post_init__(self):
    if self.along not in ALONG:
      raise ValueError(f"QuantizeSpec.along must be one of {ALONG}, got {self.along!r}")
    if self.block_shape is not None and tuple(self.block_shape) != (16, 16):
      raise ValueError(f"QuantizeSpec.block_shape must be None or (16, 16), got {self.block_shape}")
    if self.rounding == "eden" and self.hadamard == 0:
      raise ValueError("QuantizeSpec: rounding='eden' is MS-EDEN with its rotation; set hadamard=128")

  @property
  def axis(self) -> int:
    """The axis of ``x`` the blocks run along (as ``fp4jax.quantize`` takes it)."""
    return -1 if self.along == "rows" else 0

  @property
  def block(self) -> int:
    return self.fmt.block_size

  @property
  def quantize_kwargs(self) -> dict:
    """Keyword arguments that make ``fp4jax.quantize`` compute this spec."""
    return dict(axis=self.axis, rounding=self.rounding, block_shape=self.block_shape,
                hadamard=self.hadamard or None, hadamard_signs=self.hadamard_signs)
