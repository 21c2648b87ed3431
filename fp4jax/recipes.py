"""Training recipes: which quantizer each operand of each GEMM uses (``fp4jax.dot_general(..., recipe=)``).

Public names of ``fp4jax._src.recipes`` (see there for the specifications).
"""

from fp4jax._src.recipes import (
  GEMMS,
  OperandSpec,
  Recipe,
  ShapeRule,
  bf16,
  causal,
  deterministic,
  fp8,
  fp8_block,
  get,
  ms_fp4,
  mxfp8,
  names,
  nvfp4_rtn,
  nvidia_nvfp4,
  quartet,
  quartet2,
)

__all__ = [
  "GEMMS",
  "OperandSpec",
  "Recipe",
  "ShapeRule",
  "bf16",
  "causal",
  "deterministic",
  "fp8",
  "fp8_block",
  "get",
  "ms_fp4",
  "mxfp8",
  "names",
  "nvfp4_rtn",
  "nvidia_nvfp4",
  "quartet",
  "quartet2",
]
