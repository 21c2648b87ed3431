"""``fp4jax.estimators.SELECT_OP``'s ``"pallas"`` implementation: ``pallas_triton.select_ranks`` on the rows of any
leading dims, where it takes the case.

It refuses (``fp4jax.backends.Unsupported``, so ``"auto"`` runs the XLA select) rows that are not bfloat16 (its keys
are 16-bit), longer than ``MAX_ROW`` (a program holds whole rows in registers), an empty ``x``, and ``x`` varying over
mesh axes under ``shard_map(check_vma=True)``. Against the XLA select on the 125M step's OCC rows (16384 rows of 768
and of 2048) see BENCHMARKS.md (``benchmarks/occ_bounds.py``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fp4jax._src import backends, estimators
from fp4jax_kernels.operand import check_invarying
from fp4jax_kernels.select import pallas_triton

MAX_ROW = 16384  # the longest row one program holds (tile_rows: one row of 16384 bfloat16 keys)


def select_ranks(x: jax.Array, ranks: tuple[int, ...]) -> tuple[jax.Array, ...]:
  """``fp4jax.estimators.select_ranks(x, ranks)``'s values, bit for bit, by the one-read Pallas select.

  Args:
    x: bfloat16 rows along the last axis (length ``n`` <= ``MAX_ROW``), any leading dims.
    ranks: 0-based ascending ranks, each in [0, n).

  Returns:
    One array per rank, of ``x``'s shape with the last axis of length 1.

  Raises:
    fp4jax.backends.Unsupported: a case it does not take (module docstring).
    ValueError: a rank outside [0, n), naming it.
  """
  n = x.shape[-1] if x.ndim else 0
  why = None
  if x.dtype != jnp.bfloat16:
    why = f"rows of {x.dtype} (it selects bfloat16 rows: 16-bit keys)"
  elif x.size == 0:
    why = "an empty array"
  elif n > MAX_ROW:
    why = f"rows of {n} elements, longer than MAX_ROW={MAX_ROW}"
  if why:
    raise backends.Unsupported(f"the Pallas select cannot take x of shape {x.shape}: {why}")
  check_invarying(x)
  m = math.prod(x.shape[:-1])
  out = pallas_triton.select_ranks(x.reshape(m, n), tuple(ranks), interpret=backends.pallas_interpret())
  return tuple(o.reshape(*x.shape[:-1], 1) for o in out)


def register() -> None:
  """Puts ``select_ranks`` in ``fp4jax.backends``' registry: ``estimators.SELECT_OP``'s ``"pallas"`` implementation."""
  backends.register(estimators.SELECT_OP, "pallas", select_ranks)
