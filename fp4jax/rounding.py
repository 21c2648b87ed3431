"""Exact roundings onto the E2M1, E4M3 and bf16 grids: round-to-nearest-even and stochastic.

Public names of ``fp4jax._src.rounding`` (see there for the specifications).
"""

from fp4jax._src.rounding import (
  rtn_bf16,
  rtn_e2m1,
  rtn_e4m3,
  sr_e2m1,
  sr_e4m3,
)

__all__ = [
  "rtn_bf16",
  "rtn_e2m1",
  "rtn_e4m3",
  "sr_e2m1",
  "sr_e4m3",
]
