"""Randomized Hadamard transforms (RHT) of the recipes, IEEE float32 on every backend.

Public names of ``fp4jax._src.hadamard`` (see there for the specifications).
"""

from fp4jax._src.hadamard import (
  SIZES,
  TE_SIGNS_16,
  fwht,
  hadamard,
  hadamard_matrix,
  inverse_hadamard,
  random_signs,
  rotated,
)

__all__ = [
  "SIZES",
  "TE_SIGNS_16",
  "fwht",
  "hadamard",
  "hadamard_matrix",
  "inverse_hadamard",
  "random_signs",
  "rotated",
]
