"""Blockwise (randomized) Hadamard transforms along any axis.

``H_d`` is the Sylvester Hadamard matrix (``H_1 = [1]``, ``H_2n = [[H_n, H_n], [H_n, -H_n]]``), normalized by
``1/sqrt(d)`` so it is orthogonal and symmetric. A randomized transform multiplies by a ±1 diagonal first:
``T = diag(s) · H_d / sqrt(d)``, applied to each contiguous ``d``-chunk along ``axis`` as a row vector,
``y = x_chunk · T``; its inverse is ``x_chunk = y · Tᵀ = (y · H_d / sqrt(d)) ⊙ s``.

The transform is computed with the fast Walsh-Hadamard butterfly (log2 d stages of ``a + b, a - b``) in float32
and one final scaling: elementwise, fusible, and summed in the same order on every backend (a matmul would let
CPU and GPU sum in different orders and round differently). Outputs are float32; bf16 callers round once with
``fp4jax.rounding.rtn_bf16``, as Transformer Engine does for its RHT.

Transformer Engine's NVFP4 recipe uses d = 16 with the fixed signs ``TE_SIGNS_16`` (mask 0xD7E8, LSB first
negated = 0), i.e. ``T = diag(TE_SIGNS_16) · H16 · 0.25``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

SIZES = (16, 32, 64, 128, 256)
TE_SIGNS_16 = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)


def check_size(d: int, name: str = "d") -> None:
  if d not in SIZES:
    raise ValueError(f"Hadamard size {name} must be one of {SIZES}, got {d!r}")


def hadamard_matrix(d: int) -> np.ndarray:
  """The normalized Sylvester Hadamard matrix ``H_d / sqrt(d)`` (float32 numpy, for tests and kernels)."""
  check_size(d)
  h = np.ones((1, 1), np.float32)
  while h.shape[0] < d:
    h = np.block([[h, h], [h, -h]])
  return (h / np.sqrt(d)).astype(np.float32)


def random_signs(key: jax.Array, d: int) -> jnp.ndarray:
  """A vector of ``d`` independent uniform ±1 signs (float32) from ``key``."""
  check_size(d)
  return jax.random.rademacher(key, (d,), dtype=jnp.float32)


def _fwht_last(x: jnp.ndarray, d: int) -> jnp.ndarray:
  """Unnormalized Walsh-Hadamard transform of the last axis (length ``d``) by butterflies, Sylvester order."""
  lead = x.shape[:-1]
  h = 1
  while h < d:
    y = x.reshape(*lead, d // (2 * h), 2, h)
    a, b = y[..., 0, :], y[..., 1, :]
    x = jnp.stack([a + b, a - b], axis=-2).reshape(*lead, d)
    h *= 2
  return x


def _chunked(x: jnp.ndarray, d: int, axis: int):
  axis = axis % x.ndim
  n = x.shape[axis]
  if n % d:
    raise ValueError(f"Hadamard size {d} must divide the length {n} of axis {axis} (shape {x.shape})")
  moved = jnp.moveaxis(x, axis, -1)
  return moved.reshape(*moved.shape[:-1], n // d, d), moved.shape, axis


def hadamard(x: jnp.ndarray, d: int, *, axis: int = -1, signs: jnp.ndarray | np.ndarray | None = None) -> jnp.ndarray:
  """``y = x_chunk · diag(signs) · H_d / sqrt(d)`` for every ``d``-chunk along ``axis``; float32 result.

  Args:
    x: any float array whose ``axis`` length is a multiple of ``d``.
    d: transform size, one of ``SIZES``.
    axis: the axis the chunks run along.
    signs: optional ±1 vector of length ``d`` (``random_signs`` or ``TE_SIGNS_16``); None means all +1.
  """
  check_size(d)
  chunks, moved_shape, axis = _chunked(x.astype(jnp.float32), d, axis)
  if signs is not None:
    chunks = chunks * _check_signs(signs, d)
  y = _fwht_last(chunks, d) * jnp.float32(1.0 / math.sqrt(d))
  return jnp.moveaxis(y.reshape(moved_shape), -1, axis)


def inverse_hadamard(y: jnp.ndarray, d: int, *, axis: int = -1, signs: jnp.ndarray | np.ndarray | None = None) -> jnp.ndarray:
  """Inverse (= transpose) of ``hadamard``: ``x_chunk = (y_chunk · H_d / sqrt(d)) ⊙ signs``; float32 result."""
  check_size(d)
  chunks, moved_shape, axis = _chunked(y.astype(jnp.float32), d, axis)
  x = _fwht_last(chunks, d) * jnp.float32(1.0 / math.sqrt(d))
  if signs is not None:
    x = x * _check_signs(signs, d)
  return jnp.moveaxis(x.reshape(moved_shape), -1, axis)


def _check_signs(signs, d: int) -> jnp.ndarray:
  signs = jnp.asarray(signs, jnp.float32)
  if signs.shape != (d,):
    raise ValueError(f"signs must have shape ({d},) for a size-{d} Hadamard transform, got {signs.shape}")
  return signs
