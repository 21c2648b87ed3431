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
  """‖x − q‖² / ‖x‖²."""
  x, q = _f32(x, q)
  return jnp.sum(jnp.square(x - q)) / jnp.sum(jnp.square(x))


def snr_bits(x: jax.Array, q: jax.Array) -> jax.Array:
  """−½ · log2(relative MSE): bits of signal above the quantization noise."""
  return -0.5 * jnp.log2(relative_mse(x, q))


def misalignment(x: jax.Array, q: jax.Array) -> jax.Array:
  """1 − ⟨x, q⟩ / ⟨x, x⟩."""
  x, q = _f32(x, q)
  return 1.0 - jnp.sum(x * q) / jnp.sum(x * x)


def cosine(a: jax.Array, b: jax.Array) -> jax.Array:
  """⟨a, b⟩ / (‖a‖ · ‖b‖)."""
  a, b = _f32(a, b)
  return jnp.sum(a * b) / jnp.sqrt(jnp.sum(a * a) * jnp.sum(b * b))
