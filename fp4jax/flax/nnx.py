"""FP4 layers for Flax NNX and rule-based quantization of NNX models.

Public names of ``fp4jax._src.flax.nnx``.
"""

from fp4jax._src.flax.nnx import (
  DotGeneral,
  Einsum,
  EinsumOp,
  Linear,
  MoE,
  RaggedDot,
  layer_recipe,
  layers,
  quantize,
  set_recipe,
)

__all__ = [
  "DotGeneral",
  "Einsum",
  "EinsumOp",
  "Linear",
  "MoE",
  "RaggedDot",
  "layer_recipe",
  "layers",
  "quantize",
  "set_recipe",
]
