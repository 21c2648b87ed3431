"""What the fused quantize kernels take besides the quantizer, and what they return.

The quantizer is ``fp4jax.QuantizeSpec`` (format, block shape, rounding, Hadamard and its signs), validated by its
own constructor. ``KernelOutput`` (frozen, hashable: a static argument under ``jit``) says what a kernel writes and
in which layout; ``check`` is the one place that adds the kernels' limits on a valid quantizer. ``Quantized`` is what
a kernel returns.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp

from fp4jax._src.quantize import QTensor, check_quantize_spec
from fp4jax._src.spec import QuantizeSpec

Along = Literal["rows", "cols", "rows_of_transpose"]
Dequantize = Literal["with_tensor_scale", "block_scaled_only"]


@dataclasses.dataclass(frozen=True)
class KernelOutput:
  """What a fused quantize kernel writes, and in which layout (the quantizer is the ``fp4jax.QuantizeSpec``).

  Attributes:
    along: ``"rows"`` quantizes along the last axis (``fp4jax.quantize(x, spec, axis=-1)``). The other two quantize
      along axis 0 and write the result transposed, contiguous along the quantized axis (the K-major operand of
      the weight-gradient GEMM, without a transpose pass); they differ only in how random bits are indexed:
      ``"cols"`` is ``fp4jax.quantize(x, spec, axis=0)`` (bits of ``x``'s row-major indices),
      ``"rows_of_transpose"`` is ``fp4jax.quantize(x.T, spec)`` (bits of ``xᵀ``'s row-major indices: what
      ``fp4jax.dot_general``'s XLA path draws for the operands it transposes).
    dequantize: None, or also write the dequantized tensor in the Hadamard domain: ``"with_tensor_scale"``
      (``fake_quantize(..., rotated=True)``, ``f32(value(q)·dec_b)·s_dec`` in ``x.dtype``) or
      ``"block_scaled_only"`` (``value(q)·dec_b`` without the tensor scale, in bfloat16, where it is exact: what
      ``fp4jax.operand`` multiplies in its GEMMs).
    trust_mask: also write QuEST's trust mask (uint8, 1 where ``|x̂| < 6·dec_b·s_dec``, ``fp4jax.estimators``).
    packed: write the packed codes and block scales (the ``QTensor``). False writes only what ``dequantize`` and
      ``trust_mask`` ask for (a GEMM on the bf16 values needs nothing else); it needs ``dequantize``.

  Raises:
    TypeError: ``trust_mask`` or ``packed`` not a bool, naming the field.
    ValueError: ``along`` or ``dequantize`` outside its options, or ``packed=False`` without ``dequantize``, naming
      the field.
  """

  along: Along = "rows"
  dequantize: Dequantize | None = None
  trust_mask: bool = False
  packed: bool = True

  def __post_init__(self):
    if self.along not in get_args(Along):
      raise ValueError(f"KernelOutput.along must be one of {get_args(Along)}, got {self.along!r}")
    if self.dequantize is not None and self.dequantize not in get_args(Dequantize):
      raise ValueError(
        f"KernelOutput.dequantize must be None or one of {get_args(Dequantize)}, got {self.dequantize!r}"
      )
    for name in ("trust_mask", "packed"):
      if not isinstance(getattr(self, name), bool):
        raise TypeError(f"KernelOutput.{name} must be a bool, got {getattr(self, name)!r}")
    if not self.packed and self.dequantize is None:
      raise ValueError("KernelOutput(packed=False) writes only the dequantized tensor: set dequantize too")

  @property
  def transposed(self) -> bool:
    """Blocks run along axis 0 of ``x`` and the outputs are written transposed (K-major)."""
    return self.along != "rows"

  @property
  def axis(self) -> int:
    """The axis of ``x`` the blocks run along."""
    return 0 if self.transposed else -1


def check(spec: QuantizeSpec, output: KernelOutput) -> None:
  """The kernels' arguments: an ``fp4jax.QuantizeSpec`` that ``fp4jax.quantize`` computes (an ``FP4Format``, no
  clipping, the tensor's amax) and MS-EDEN with its rotation (the kernels apply its Hadamard), and a
  ``KernelOutput`` (validated by its constructor).

  Raises:
    TypeError: ``spec`` not a ``QuantizeSpec``, ``output`` not a ``KernelOutput``, ``spec.fmt`` not an
      ``FP4Format``.
    ValueError: a ``spec`` field the kernels do not take, naming it.
  """
  if not isinstance(spec, QuantizeSpec):
    raise TypeError(f"spec must be an fp4jax.QuantizeSpec, got {spec!r} of type {type(spec).__name__}")
  if not isinstance(output, KernelOutput):
    raise TypeError(f"output must be a KernelOutput, got {output!r} of type {type(output).__name__}")
  check_quantize_spec(spec)
  if spec.rounding == "eden" and not spec.hadamard:
    raise ValueError("spec.rounding='eden': the kernels run MS-EDEN with its rotation; set spec.hadamard=128")


def check_signs(spec: QuantizeSpec, signs) -> None:
  """An explicit Hadamard sign vector replaces the draw of random signs: ``spec.signs="random"``, shape
  ``(spec.hadamard,)``; ValueError naming ``signs`` otherwise."""
  if spec.signs != "random":
    raise ValueError(
      f"signs: an explicit sign vector replaces the random draw; it needs spec.signs='random', got {spec.signs!r}"
    )
  if jnp.shape(signs) != (spec.hadamard,):
    raise ValueError(f"signs must have shape ({spec.hadamard},) (one per Hadamard point), got {jnp.shape(signs)}")


def unit(spec: QuantizeSpec) -> int:
  """Elements that must stay together along the quantized axis: a block, or a Hadamard chunk when larger."""
  return max(spec.fmt.block_size, spec.hadamard or 1)


class Quantized(NamedTuple):
  """What a fused quantize returns: the ``QTensor`` (None unless ``output.packed``), the optional outputs
  ``KernelOutput`` asks for (or None), and the tensor's fp32 decode scale (``QTensor.global_scale``)."""

  qtensor: QTensor | None
  dequantized: jax.Array | None
  trust_mask: jax.Array | None
  global_scale: jax.Array
