"""Counter-based random bits (the same on every backend and in the kernels) for stochastic rounding.

Public names of ``fp4jax._src.bits`` (see there for the specifications).
"""

from fp4jax._src.bits import (
  fmix32,
  hash_bits,
  random_bits,
  seed_from_key,
  uniform_from_bits,
)

__all__ = [
  "fmix32",
  "hash_bits",
  "random_bits",
  "seed_from_key",
  "uniform_from_bits",
]
