"""The cuBLAS / tcgen05 128x4 block-scale layout ("swizzled" scale factors for block-scaled FP4/FP8 GEMMs).

A (R, C) scale matrix (R = rows of the operand, C = K / block) is padded to R' = ceil(R/128)·128 rows and
C' = ceil(C/4)·4 columns (padding bytes are 0) and stored as (R'/128)·(C'/4) tiles of 512 bytes, tiles ordered
row-major over (row tile, column tile). Inside a tile, row r = 128·mt + 32·i + j (i in 0..3, j in 0..31) and column
c = 4·nt + k (k in 0..3) go to

    offset(r, c) = (mt · Nt + nt) · 512 + j · 16 + i · 4 + k,        Nt = C' / 4

(NVIDIA cuBLAS docs, "1D block scaling factors layout"; the same layout tcgen05.mma reads from tensor memory).
Pure reshapes/transposes: exact for any dtype; works on uint8 bit patterns and float8 arrays alike.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

TILE_ROWS, TILE_COLS = 128, 4


def padded_shape(rows: int, cols: int) -> tuple[int, int]:
  return -(-rows // TILE_ROWS) * TILE_ROWS, -(-cols // TILE_COLS) * TILE_COLS


def swizzle(scales: jax.Array) -> jax.Array:
  """(R, C) scales -> flat (R'·C',) array in the 128x4 tiled layout (padding zeros)."""
  if scales.ndim != 2:
    raise ValueError(f"scales must be 2D (rows, K/block), got shape {scales.shape}")
  r, c = scales.shape
  rp, cp = padded_shape(r, c)
  s = jnp.pad(scales, ((0, rp - r), (0, cp - c)))
  # (mt, i, j, nt, k) -> (mt, nt, j, i, k)
  s = s.reshape(rp // 128, 4, 32, cp // 4, 4).transpose(0, 3, 2, 1, 4)
  return s.reshape(rp * cp)


def unswizzle(flat: jax.Array, rows: int, cols: int) -> jax.Array:
  """Inverse of ``swizzle``: the flat tiled layout -> (rows, cols) scales (padding dropped)."""
  rp, cp = padded_shape(rows, cols)
  if flat.shape != (rp * cp,):
    raise ValueError(f"flat must have shape ({rp * cp},) for ({rows}, {cols}) scales, got {flat.shape}")
  s = flat.reshape(rp // 128, cp // 4, 32, 4, 4).transpose(0, 3, 2, 1, 4)
  return s.reshape(rp, cp)[:rows, :cols]


def offset(r: int, c: int, cols: int) -> int:
  """Flat offset of scale (r, c) in the swizzled layout of a matrix with ``cols`` scale columns (host integers)."""
  nt_count = -(-cols // TILE_COLS)
  mt, rem = divmod(r, 128)
  i, j = divmod(rem, 32)
  nt, k = divmod(c, 4)
  return (mt * nt_count + nt) * 512 + j * 16 + i * 4 + k
