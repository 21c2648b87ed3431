"""FP8: current scaling (E4M3, E5M2), the FP8 baseline recipe's quantizer, and block-scaled FP8 (MXFP8, FP8 block
scaling: ``quantize_blocks`` / ``fake_quantize_blocks``).

Public names of ``fp4jax._src.fp8`` and ``fp4jax._src.quantize`` (see there for the specifications).
"""

from fp4jax._src.formats import FP8_BLOCK, MXFP8, BlockFP8Format, FP8BlockFormat, MXFP8Format
from fp4jax._src.fp8 import (
  E4M3,
  E5M2,
  current_scale,
  quantize_fp8,
  rtn_e5m2,
)
from fp4jax._src.quantize import fake_quantize_fp8_blocks as fake_quantize_blocks
from fp4jax._src.quantize import quantize_fp8_blocks as quantize_blocks

__all__ = [
  "E4M3",
  "E5M2",
  "FP8_BLOCK",
  "MXFP8",
  "BlockFP8Format",
  "FP8BlockFormat",
  "MXFP8Format",
  "current_scale",
  "fake_quantize_blocks",
  "quantize_blocks",
  "quantize_fp8",
  "rtn_e5m2",
]
