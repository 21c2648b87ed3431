"""Quantization-error metrics (Quartet II's conventions).

* relative MSE   ‖x − Q(x)‖² / ‖x‖²
* SNR bits       −½ · log2(relative MSE)
* misalignment   1 − ⟨x, Q(x)⟩ / ⟨x, x⟩  (0 for an unbiased quantizer in expectation)
* cosine         ⟨a, b⟩ / (‖a‖ ‖b‖)

All sums are over every element, in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _f32(*xs):
  return tuple(jnp.asarray(x, jnp.float32) for x in xs)


def relative_mse(x: jax.Array, q: jax.Array) -> jax.Array:
  """Relative mean squared error ‖x − q‖² / ‖x‖², summed over every element in float32.

  Args:
    x: the reference array.
    q: the approximation, of ``x``'s shape (or broadcastable to it).

  Returns:
    float32 scalar (NaN when ``x`` is all zero and ``q == x``; Inf when only ``x`` is zero).
  """
  x, q = _f32(x, q)
  return jnp.sum(jnp.square(x - q)) / jnp.sum(jnp.square(x))


def snr_bits(x: jax.Array, q: jax.Array) -> jax.Array:
  """−½ · log2(relative MSE): bits of signal above the quantization noise.

  Args:
    x: the reference array.
    q: the approximation, of ``x``'s shape (or broadcastable to it).

  Returns:
    float32 scalar (Inf when ``q == x`` exactly).
  """
  return -0.5 * jnp.log2(relative_mse(x, q))


def misalignment(x: jax.Array, q: jax.Array) -> jax.Array:
  """1 − ⟨x, q⟩ / ⟨x, x⟩, summed over every element in float32 (0 for an unbiased quantizer in expectation).

  Args:
    x: the reference array.
    q: the approximation, of ``x``'s shape (or broadcastable to it).

  Returns:
    float32 scalar.
  """
  x, q = _f32(x, q)
  return 1.0 - jnp.sum(x * q) / jnp.sum(x * x)


def cosine(a: jax.Array, b: jax.Array) -> jax.Array:
  """Cosine similarity ⟨a, b⟩ / (‖a‖ · ‖b‖), summed over every element in float32.

  Args:
    a: first array.
    b: second array, of ``a``'s shape (or broadcastable to it).

  Returns:
    float32 scalar in [-1, 1] (NaN when either array is all zero).
  """
  a, b = _f32(a, b)
  return jnp.sum(a * b) / jnp.sqrt(jnp.sum(a * a) * jnp.sum(b * b))


# ------------------------------------------------------------------------------------------------ gradients
def _tree_dot(a, b) -> jax.Array:
  """Σ over all leaves of Σ a·b, in float32 (``a`` and ``b`` must have the same tree structure)."""
  return sum(jnp.sum(x * y) for x, y in zip(_f32(*jax.tree.leaves(a)), _f32(*jax.tree.leaves(b))))


def tree_cosine(a, b) -> jax.Array:
  """Cosine similarity of two pytrees of the same structure, as one flattened vector (float32).

  Args:
    a: a pytree of arrays.
    b: a pytree of arrays with ``a``'s structure and leaf shapes.

  Returns:
    float32 scalar.
  """
  return _tree_dot(a, b) / jnp.sqrt(_tree_dot(a, a) * _tree_dot(b, b))


def tree_misalignment(exact, approx) -> jax.Array:
  """1 − ⟨g, ĝ⟩ / ⟨g, g⟩ over pytrees: the relative shrinkage of ``approx`` along ``exact`` (0 if unbiased on average).

  Args:
    exact: the reference pytree ``g``.
    approx: the approximate pytree ``ĝ``, with ``exact``'s structure and leaf shapes.

  Returns:
    float32 scalar.
  """
  return 1.0 - _tree_dot(exact, approx) / _tree_dot(exact, exact)


def gradient_alignment(loss_fn, params, *args, recipe, key=None, exact_recipe="bf16") -> dict[str, jax.Array]:
  """Cosine and misalignment of ``recipe``'s gradients of ``loss_fn`` against those of ``exact_recipe``.

  ``loss_fn(params, *args, recipe=..., key=...)`` must route its matmuls through ``fp4jax.dot_general`` /
  ``fp4jax.einsum`` with the given recipe and key; gradients are taken with respect to ``params``.

  Args:
    loss_fn: scalar loss function of ``(params, *args, recipe=, key=)``.
    params: the pytree the gradients are taken of.
    *args: further positional arguments of ``loss_fn`` (e.g. a batch).
    recipe: the recipe under test (passed to ``loss_fn``).
    key: the PRNG key passed to ``loss_fn`` with ``recipe`` (the exact run gets None).
    exact_recipe: the reference recipe (default ``"bf16"``).

  Returns:
    ``{"cosine": ..., "misalignment": ...}``: float32 scalars over all leaves (``tree_cosine``,
    ``tree_misalignment`` of the exact gradients against ``recipe``'s).
  """
  grads = jax.grad(loss_fn)(params, *args, recipe=recipe, key=key)
  exact = jax.grad(loss_fn)(params, *args, recipe=exact_recipe, key=None)
  return {"cosine": tree_cosine(exact, grads), "misalignment": tree_misalignment(exact, grads)}
