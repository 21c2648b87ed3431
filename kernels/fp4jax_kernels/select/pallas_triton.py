"""Per-row order statistics of bfloat16 rows in one read: Pallas on the Triton backend.

``select_ranks(x, ranks)`` gives what ``fp4jax.estimators.select_ranks`` gives for a 2D bfloat16 ``x``: for each
0-based rank, the value at that rank of every row sorted ascending (keepdims), with the same order keys
(``estimators._order_keys``: −0 equal to +0 and returned as +0, every NaN after +Inf). Both are most-significant-
digit radix selects with 1-bit digits: with the key's higher bits ``p`` settled, bit ``s`` is 1 exactly when
``#{key < p + 2^s} ≤ rank``. The XLA select makes one counting pass over ``x`` per key bit (16 for bfloat16); here a
program loads a tile of whole rows once, keeps their 16-bit keys in registers and settles all 16 bits of every rank
there. Bytes: ``sizeof(x)`` read per element and one int32 key per row and rank written (decoded by XLA); work: ``16 ·
len(ranks)`` compares and counts per element.

Microsoft FP4's OCC clamp bounds (``estimators.occ_bounds``) are such a select; ``fp4jax_kernels.select.api``
registers this kernel as their ``"pallas"`` implementation. ``benchmarks/occ_bounds.py`` times it beside the XLA
select.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from fp4jax._src.estimators import _from_order_keys
from fp4jax_kernels.edge_blocks import load_in_bounds, store_in_bounds

KEY_BITS = 16  # bfloat16 keys
PAD_KEY = 1 << KEY_BITS  # the key of a padding column: above every key and threshold, so it never counts
TILE_ELEMENTS = 8192  # elements of x per program (whole rows, padded to a power of two)


def order_keys16(x: jax.Array) -> jax.Array:
  """``estimators._order_keys`` of bfloat16 values, as int32 in [0, 2^16): the bfloat16 bits are the high half of
  the exact float32 conversion; non-negative values map to ``bits | 0x8000``, negative ones to ``~bits``, −0 to +0's
  key and NaN to ``0xFFFF``."""
  xf = x.astype(jnp.float32)
  bits = lax.shift_right_logical(lax.bitcast_convert_type(xf, jnp.int32), jnp.int32(16))
  bits = jnp.where(xf == 0, jnp.int32(0), bits)
  negative = lax.shift_right_logical(bits, jnp.int32(KEY_BITS - 1)) == 1
  keys = jnp.where(negative, jnp.int32(0xFFFF) - bits, bits + jnp.int32(0x8000))
  return jnp.where(jnp.isnan(xf), jnp.int32(0xFFFF), keys)


def _kernel(x_ref, *out_refs, ranks: tuple[int, ...], n: int, shape: tuple[int, int]):
  """One tile of whole rows: their keys once, then each rank's key settled bit by bit in registers."""
  i = pl.program_id(0)
  x = load_in_bounds(x_ref, (i, 0), shape)
  keys = order_keys16(x)
  columns = lax.broadcasted_iota(jnp.int32, keys.shape, 1)
  keys = jnp.where(columns < n, keys, jnp.int32(PAD_KEY))
  for rank, out_ref in zip(ranks, out_refs):
    found = jnp.zeros((keys.shape[0],), jnp.int32)
    for s in reversed(range(KEY_BITS)):
      threshold = found + jnp.int32(1 << s)
      below = jnp.sum((keys < threshold[:, None]).astype(jnp.int32), axis=1)
      found = jnp.where(below <= rank, threshold, found)
    store_in_bounds(out_ref, found, (i,), (shape[0],))


def tile_rows(n: int) -> tuple[int, int]:
  """(rows per program, padded row length): the row padded to a power of two, and as many rows as fill
  ``TILE_ELEMENTS`` (at least one)."""
  width = 1 << max(0, (n - 1).bit_length())
  return max(1, TILE_ELEMENTS // width), width


@functools.partial(jax.jit, static_argnames=("ranks", "num_warps", "interpret"))
def select_ranks(
  x: jax.Array, ranks: tuple[int, ...], *, num_warps: int = 8, interpret: bool = False
) -> tuple[jax.Array, ...]:
  """For each 0-based rank, the value at that rank of every row of ``x`` sorted ascending, shape (rows, 1): the
  values of ``fp4jax.estimators.select_ranks(x, ranks)``, bit for bit.

  Args:
    x: (rows, n) bfloat16.
    ranks: 0-based ascending ranks, each in [0, n).
    num_warps: warps per program.
    interpret: Pallas interpret mode (the CPU).

  Returns:
    One (rows, 1) bfloat16 array per rank.

  Raises:
    ValueError: ``x`` not 2D, or a rank outside [0, n), naming it.
    TypeError: ``x`` not bfloat16.
  """
  if x.ndim != 2:
    raise ValueError(f"select_ranks: x must be 2D (rows, n), got shape {x.shape}")
  if x.dtype != jnp.bfloat16:
    raise TypeError(f"select_ranks: x must be bfloat16 (16-bit order keys), got {x.dtype}")
  m, n = x.shape
  if not ranks or any(not 0 <= r < n for r in ranks):
    raise ValueError(f"select_ranks: ranks must lie in [0, {n}) for rows of length {n}, got {ranks}")
  rows, width = tile_rows(n)
  keys = pl.pallas_call(
    functools.partial(_kernel, ranks=tuple(ranks), n=n, shape=(m, n)),
    grid=(pl.cdiv(m, rows),),
    in_specs=[pl.BlockSpec((rows, width), lambda i: (i, 0))],
    out_specs=[pl.BlockSpec((rows,), lambda i: (i,)) for _ in ranks],
    out_shape=[jax.ShapeDtypeStruct((m,), jnp.int32) for _ in ranks],
    compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
    interpret=interpret,
    name="fp4_select_ranks",
  )(x)
  return tuple(_from_order_keys(k.astype(jnp.uint16), jnp.bfloat16)[:, None] for k in keys)
