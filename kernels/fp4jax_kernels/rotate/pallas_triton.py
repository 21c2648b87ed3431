"""The inverse blockwise Hadamard of float32 rows, trust mask first, in one pass: Pallas on the Triton backend.

``inverse_rotate(g, d, signs, mask)`` gives ``fp4jax.hadamard.inverse_hadamard(where(mask, g, 0), d, axis=-1,
signs)`` for a 2D float32 ``g``: each program loads a tile of whole ``d``-chunks as ``d/VECTOR_PART`` vector parts
(``VECTOR_PART`` contiguous elements of every chunk), zeroes the masked elements, runs the constant-geometry
butterflies of ``fp4jax.hadamard.fwht`` (each ``a ± b`` rounded once, in the same order: ``fwht_parts`` between the
parts, then ``fwht`` within each), multiplies by ``float32(1/sqrt(d))`` (rounded once) and then by the signs (exact),
and stores the parts: one read and one write of ``g`` where XLA's butterflies make a pass per stage (five for
d = 32). IEEE float32 as a GPU computes it; in interpret mode (the CPU) XLA's arithmetic, which flushes subnormals.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from fp4jax._src import hadamard as hadamard_lib
from fp4jax_kernels.quantize.pallas_triton import (
  VECTOR_PART,
  fwht_vector_parts,
  load_vector_parts,
  store_vector_parts,
  vector_shape,
)

TILE_ELEMENTS = 8192  # float32 elements per program
MAX_COLS = 1024  # the widest tile (a power of two dividing the row)


def tile(m: int, n: int, d: int) -> tuple[int, int]:
  """(rows, cols) of a program's tile: cols the largest power of two up to ``MAX_COLS`` dividing ``n`` (a multiple
  of ``d``, which divides ``n``), rows a power of two filling ``TILE_ELEMENTS`` (at most ``m`` rounded up)."""
  cols = d
  while cols * 2 <= MAX_COLS and n % (cols * 2) == 0:
    cols *= 2
  rows = max(1, TILE_ELEMENTS // cols)
  return min(rows, 1 << max(0, (m - 1).bit_length())), cols


def _kernel(g_ref, signs_ref, *refs, shape: tuple[int, int, int, int], masked: bool):
  """One (rows, cols) tile, read as its ``d/VECTOR_PART`` vector parts (``load_vector_parts``: ``VECTOR_PART``
  contiguous elements of every chunk, one load each), masked, rotated by ``fwht_vector_parts`` (``fwht``'s sums in its
  order, so ``inverse_hadamard``'s), signed, and each part stored where it was read."""
  mask_ref, out_ref = refs if masked else (None, refs[0])
  index = (pl.program_id(0), pl.program_id(1))
  parts = load_vector_parts(g_ref, index, shape)
  if masked:
    parts = [jnp.where(m, x, jnp.float32(0)) for m, x in zip(load_vector_parts(mask_ref, index, shape), parts)]
  v = parts[0].shape[-1]
  parts = [x * signs_ref[pl.ds(p * v, v)].reshape(1, 1, v) for p, x in enumerate(fwht_vector_parts(parts))]
  store_vector_parts(out_ref, parts, index, shape)


@functools.partial(jax.jit, static_argnames=("d", "num_warps", "interpret"))
def inverse_rotate(
  g: jax.Array,
  d: int,
  signs: jax.Array | None = None,
  mask: jax.Array | None = None,
  *,
  num_warps: int = 4,
  interpret: bool = False,
) -> jax.Array:
  """``fp4jax.hadamard.inverse_hadamard(where(mask, g, 0), d, axis=-1, signs)`` of a 2D float32 ``g``, bit for bit
  (IEEE float32 on a GPU).

  Args:
    g: (m, n) float32, ``n`` a multiple of ``d``.
    d: the transform size, a power of two in ``fp4jax.hadamard.SIZES``.
    signs: the forward transform's ±1 vector of length ``d``; None means all +1.
    mask: None, or an (m, n) trust mask (bool): the gradient is zeroed where it is False.
    num_warps: warps per program.
    interpret: Pallas interpret mode (the CPU).

  Returns:
    (m, n) float32.

  Raises:
    ValueError: ``g`` not 2D float32, ``d`` not dividing ``n``, ``signs`` or ``mask`` of the wrong shape.
  """
  hadamard_lib.check_size(d)
  if g.ndim != 2 or g.dtype != jnp.float32:
    raise ValueError(f"inverse_rotate: g must be 2D float32, got {g.dtype} of shape {g.shape}")
  m, n = g.shape
  if n % d:
    raise ValueError(f"inverse_rotate: d={d} must divide the row length {n} of g (shape {g.shape})")
  signs = jnp.ones((d,), jnp.float32) if signs is None else jnp.asarray(signs, jnp.float32)
  if signs.shape != (d,):
    raise ValueError(f"inverse_rotate: signs must have shape ({d},), got {signs.shape}")
  if mask is not None and mask.shape != g.shape:
    raise ValueError(f"inverse_rotate: mask must have g's shape {g.shape}, got {mask.shape}")
  rows, cols = tile(m, n, d)
  shape = vector_shape((m, n), d)  # part p (axis 2): elements [p·VECTOR_PART, (p+1)·VECTOR_PART) of every chunk
  block = pl.BlockSpec((rows, cols // d, d // VECTOR_PART, VECTOR_PART), lambda i, j: (i, j, 0, 0))
  args, in_specs = [g.reshape(shape), signs], [block, pl.BlockSpec((d,), lambda i, j: (0,))]
  if mask is not None:
    args.append(mask.reshape(shape))
    in_specs.append(block)
  return pl.pallas_call(
    functools.partial(_kernel, shape=shape, masked=mask is not None),
    grid=(pl.cdiv(m, rows), n // cols),
    in_specs=in_specs,
    out_specs=block,
    out_shape=jax.ShapeDtypeStruct(shape, jnp.float32),
    compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
    interpret=interpret,
    name="fp4_inverse_rotate",
  )(*args).reshape(m, n)
