"""Training recipes: which quantizer each operand of each GEMM uses (``fp4jax.dot_general(..., recipe=)``).

Public names of ``fp4jax._src.recipes`` (see there for the specifications).
"""

from fp4jax._src.recipes import (
  GEMMS,
  HIGH_PRECISION,
  OPERANDS,
  PUBLISHED,
  REUSE_FORWARD,
  OperandSpec,
  Recipe,
  ShapeRule,
  bf16,
  causal,
  compose,
  deterministic,
  fp8,
  get,
  ms_fp4,
  names,
  nvfp4_rtn,
  nvidia_nvfp4,
  quartet,
  quartet2,
  register,
  unregister,
)

__all__ = [
  "GEMMS",
  "HIGH_PRECISION",
  "OPERANDS",
  "PUBLISHED",
  "REUSE_FORWARD",
  "OperandSpec",
  "Recipe",
  "ShapeRule",
  "bf16",
  "causal",
  "compose",
  "deterministic",
  "fp8",
  "get",
  "ms_fp4",
  "names",
  "nvfp4_rtn",
  "nvidia_nvfp4",
  "quartet",
  "quartet2",
  "register",
  "unregister",
]
