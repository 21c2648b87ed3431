"""``fp4jax._src.operand.INVERSE_ROTATE_OP``'s ``"pallas"`` implementation: ``pallas_triton.inverse_rotate`` on the
rows of any leading dims, where it takes the case.

It refuses (``fp4jax.backends.Unsupported``, so ``"auto"`` runs XLA's butterflies) a gradient that is not float32,
a transform larger than ``MAX_D``, a row length ``d`` does not divide, an empty or scalar array, and a gradient
varying over mesh axes under ``shard_map(check_vma=True)``. Against XLA's butterflies in quartet's 125M step see
BENCHMARKS.md (``benchmarks/pallas_ablation.py --op inverse_rotate --recipe quartet``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fp4jax._src import backends
from fp4jax._src.operand import INVERSE_ROTATE_OP
from fp4jax_kernels.operand import check_invarying
from fp4jax_kernels.rotate import pallas_triton

MAX_D = 32  # the sizes timed in a training step (quartet's 32); larger transforms keep XLA's butterflies


def inverse_rotate(g: jax.Array, d: int, signs: jax.Array | None, mask: jax.Array | None) -> jax.Array:
  """``fp4jax._src.operand.inverse_rotate``'s values, bit for bit: ``pallas_triton.inverse_rotate`` on the rows of any
  leading dims.

  Args:
    g: float32 gradient, rows along the last axis, any leading dims.
    d: the transform size.
    signs: the forward transform's ±1 vector of length ``d``, or None.
    mask: None, or a trust mask (bool) of ``g``'s shape.

  Returns:
    float32 array of ``g``'s shape.

  Raises:
    fp4jax.backends.Unsupported: a gradient that is not float32, ``d > MAX_D``, a row length ``d`` does not divide
      (XLA's path then raises the error naming it), an empty or scalar array, a gradient varying over mesh axes
      under ``shard_map(check_vma=True)``; ``fp4jax._src.operand.inverse_rotate`` then runs XLA's butterflies.
  """
  why = None
  if g.dtype != jnp.float32:
    why = f"a {g.dtype} gradient (it rotates float32)"
  elif d > MAX_D:
    why = f"d={d} > MAX_D={MAX_D}"
  elif g.ndim == 0 or g.size == 0:
    why = "an empty or scalar gradient"
  elif g.shape[-1] % d:
    why = f"d={d} does not divide the row length {g.shape[-1]}"
  if why:
    raise backends.Unsupported(f"the Pallas inverse rotation cannot take g of shape {g.shape}: {why}")
  check_invarying(g)
  n = g.shape[-1]
  m = math.prod(g.shape[:-1])
  flat_mask = None if mask is None else jnp.broadcast_to(mask, g.shape).reshape(m, n)
  y = pallas_triton.inverse_rotate(g.reshape(m, n), d, signs, flat_mask, interpret=backends.pallas_interpret())
  return y.reshape(g.shape)


def register() -> None:
  """Puts ``inverse_rotate`` in ``fp4jax.backends``' registry as ``INVERSE_ROTATE_OP``'s ``"pallas"`` implementation
  (undo: ``fp4jax.backends.unregister(INVERSE_ROTATE_OP, "pallas")``)."""
  backends.register(INVERSE_ROTATE_OP, "pallas", inverse_rotate)
