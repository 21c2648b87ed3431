"""FP4 layers for Flax linen and rule-based quantization of linen models.

Public names of ``fp4jax._src.flax.linen``.
"""

from fp4jax._src.flax.linen import (
  Dense,
  DenseGeneral,
  DotGeneral,
  Einsum,
  MoE,
  QuantizedModule,
  quantize,
)

__all__ = [
  "Dense",
  "DenseGeneral",
  "DotGeneral",
  "Einsum",
  "MoE",
  "QuantizedModule",
  "quantize",
]
