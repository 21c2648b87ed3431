"""Block and tensor scales of NVFP4 and MXFP4: every published rule (absmax, four-over-six, floor, rceil, QuEST).

Public names of ``fp4jax._src.scaling`` (see there for the specifications).
"""

from fp4jax._src.scaling import (
  mx_element_prescale,
  mx_exponents,
  nvfp4_block_scales,
  nvfp4_tensor_scales,
)

__all__ = [
  "mx_element_prescale",
  "mx_exponents",
  "nvfp4_block_scales",
  "nvfp4_tensor_scales",
]
