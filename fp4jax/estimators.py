"""Backward estimators of the recipes: Quartet's trust mask, MS-FP4's DGE, outlier-clamp bounds (OCC).

Public names of ``fp4jax._src.estimators`` (see there for the specifications).
"""

from fp4jax._src.estimators import (
  SELECT_OP,
  dge_derivative,
  occ_bounds,
  occ_clamp,
  trust_mask,
)

__all__ = [
  "SELECT_OP",
  "dge_derivative",
  "occ_bounds",
  "occ_clamp",
  "trust_mask",
]
