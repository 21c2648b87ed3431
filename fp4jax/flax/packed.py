"""Inference from packed FP4 weights (``fp4jax.flax.pack``) through ``fp4jax.packed_matmul``.

Public names of ``fp4jax._src.flax.packed``.
"""

from fp4jax._src.flax.packed import (
  apply,
  apply_nnx,
)

__all__ = [
  "apply",
  "apply_nnx",
]
