"""Rules that choose a recipe per layer, and the high-precision policy.

Public names of ``fp4jax._src.flax.rules``.
"""

from fp4jax._src.flax.rules import (
  DEFAULT_HIGH_PRECISION,
  KeepHighPrecision,
  Rule,
  keep_high_precision,
  plan,
)

__all__ = [
  "DEFAULT_HIGH_PRECISION",
  "KeepHighPrecision",
  "Rule",
  "keep_high_precision",
  "plan",
]
