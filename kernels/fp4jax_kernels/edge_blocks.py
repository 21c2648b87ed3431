"""Edge blocks of a Pallas Triton grid: masked loads and stores for arrays that are not a whole number of blocks.

Pallas on the Triton backend does not clip a block that sticks out of its array (interpret mode does): an unmasked
``ref[...]`` reads, and a store writes, the flat memory past each row's end, i.e. the next row or the next buffer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import triton as plgpu


def _in_bounds(block_shape, block_index, full_shape) -> jax.Array | None:
  """Mask of the elements of block ``block_index`` (in block units) that lie inside an array of ``full_shape``;
  None when every block of the grid is whole (the shape is a multiple of the block)."""
  if all(f % b == 0 for f, b in zip(full_shape, block_shape)):
    return None
  mask = None
  for d, (b, f, idx) in enumerate(zip(block_shape, full_shape, block_index)):
    if f % b:
      inside = idx * b + lax.broadcasted_iota(jnp.int32, block_shape, d) < f
      mask = inside if mask is None else mask & inside
  return mask


def load_in_bounds(ref, block_index, full_shape) -> jax.Array:
  """``ref[...]`` with zeros outside the array."""
  mask = _in_bounds(ref.shape, block_index, full_shape)
  return ref[...] if mask is None else plgpu.load(ref, mask=mask, other=jnp.zeros((), ref.dtype))


def store_in_bounds(ref, value, block_index, full_shape) -> None:
  """``ref[...] = value`` restricted to the array's elements (see ``load_in_bounds``)."""
  mask = _in_bounds(ref.shape, block_index, full_shape)
  if mask is None:
    ref[...] = value
  else:
    plgpu.store(ref, value, mask=mask)
