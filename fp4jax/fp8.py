"""FP8 current scaling (E4M3, E5M2): the FP8 baseline recipe's quantizer.

Public names of ``fp4jax._src.fp8`` (see there for the specifications).
"""

from fp4jax._src.fp8 import (
  E4M3,
  E5M2,
  current_scale,
  quantize_fp8,
  rtn_e5m2,
)

__all__ = [
  "E4M3",
  "E5M2",
  "current_scale",
  "quantize_fp8",
  "rtn_e5m2",
]
