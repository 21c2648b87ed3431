"""Sums in a fixed order, so that every backend and every kernel adds the same floats in the same sequence.

XLA on CPU, XLA on GPU and a Triton kernel each reduce ``jnp.sum`` in their own order, so an fp32 block sum can
differ in its last bits between them (and with it a correction factor or a standard deviation computed from it).
``pairwise_sum`` writes the reduction as explicit additions: for a power-of-two length n, stage by stage
``x[2i] + x[2i + 1]`` (neighbours), halving n until one value is left (a balanced binary tree). Explicit float
additions are never reassociated by XLA or Triton, so the result is identical everywhere.

``leading_pairwise_sum`` adds the slices of a leading axis by the same tree: with n = d·m leaves, the first log2(m)
stages leave the d partial sums of m consecutive leaves, so d devices that each hold m consecutive leaves reproduce
the one-device tree by summing locally, then summing their d partials by the tree (``fp4jax.sharding.ordered_psum``).
"""

from __future__ import annotations

import jax.numpy as jnp


def _halving_sum_last(x: jnp.ndarray) -> jnp.ndarray:
  n = x.shape[-1]
  if n & (n - 1):
    raise ValueError(f"pairwise_sum needs a power-of-two length, got {n}")
  lead = x.shape[:-1]
  while n > 1:
    n //= 2
    a, b = jnp.split(x.reshape(*lead, n, 2), 2, axis=-1)  # a last axis of size 2: Triton splits it in registers
    x = a.reshape(*lead, n) + b.reshape(*lead, n)
  return x


def leading_pairwise_sum(x: jnp.ndarray) -> jnp.ndarray:
  """Sum of ``x`` over axis 0 (removed), ``x[2i] + x[2i + 1]`` stage by stage; a power-of-two leading length."""
  n = x.shape[0]
  if n < 1 or n & (n - 1):
    raise ValueError(f"leading_pairwise_sum needs a power-of-two leading length, got shape {x.shape}")
  while n > 1:
    n //= 2
    pairs = x.reshape(n, 2, *x.shape[1:])
    x = pairs[:, 0] + pairs[:, 1]
  return x[0]


def pairwise_sum(x: jnp.ndarray, axes: tuple[int, ...]) -> jnp.ndarray:
  """Sum of ``x`` over ``axes`` (kept as size 1), each axis halved stage by stage (see the module docstring)."""
  for axis in sorted((a % x.ndim for a in axes), reverse=True):
    moved = jnp.moveaxis(x, axis, -1)
    x = jnp.moveaxis(_halving_sum_last(moved), -1, axis)  # the last axis is left with length 1
  return x
