"""The implementations behind ``backend=``: the vocabulary, the registry kernels fill, and the refusal type.

Public names of ``fp4jax._src.backends`` (see there for the specifications).
"""

from fp4jax._src.backends import (
  Backend,
  Unsupported,
  candidates,
  check,
  compute_capability,
  has_native_fp4,
  has_pallas_triton,
  implementation,
  register,
  registered,
  run,
  unregister,
)

__all__ = [
  "Backend",
  "Unsupported",
  "candidates",
  "check",
  "compute_capability",
  "has_native_fp4",
  "has_pallas_triton",
  "implementation",
  "register",
  "registered",
  "run",
  "unregister",
]
