"""The mixture-of-experts computation shared by the linen and NNX ``MoE`` layers (pure functions).

Tokens x [t, d] are routed in float32 (``route``: softmax over the router logits, the ``top_k`` largest
probabilities renormalized to sum to 1 per token), their t·top_k copies sorted by expert (``dispatch``, stable:
copies of one expert keep token order), run through the experts by two grouped GEMMs (``ragged``, e.g.
``fp4jax.ragged_dot`` under a recipe) and summed back per token weighted by the router (``combine``):

    y_t = Σ_j p_tj · W_out[e_tj]ᵀ · f(W_in[e_tj]ᵀ · x_t)

with f = activation(gate) ⊙ up (``gated``: W_in holds [gate | up], each ``hidden`` wide) or f = activation.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def router_logits(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """Router logits [t, E] = x [t, d] · kernel [d, E], both in float32, at float32 precision (``HIGHEST``: a GPU's
  default float32 matmul is TF32, which would route some tokens differently than the CPU). A plain product, not a
  Dense/Linear layer: ``fp4jax.flax.quantize``'s rules (which take those layers) never reach the router, so routing
  stays float32 under any rule, a catch-all one included."""
  return jnp.dot(x.astype(jnp.float32), kernel.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)


def route(logits: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array]:
  """(weights [t, top_k] float32 summing to 1 per token, experts [t, top_k] int32) from router logits [t, E]."""
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  weights, experts = jax.lax.top_k(probs, top_k)
  return weights / jnp.sum(weights, axis=-1, keepdims=True), experts.astype(jnp.int32)


def dispatch(x: jax.Array, experts: jax.Array, num_experts: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(x's token copies sorted by expert [t·k, d], ``order`` [t·k]: the flat (token, slot) index of each sorted row,
  group sizes [num_experts] int32)."""
  flat = experts.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  return x[order // experts.shape[1]], order, sizes


def combine(ys: jax.Array, order: jax.Array, weights: jax.Array) -> jax.Array:
  """[t, d]: the sorted expert outputs ``ys`` put back in (token, slot) order and summed with the router weights, as
  elementwise products and a sum over the k slots in ``ys.dtype`` (not a matmul, which a GPU would run as TF32)."""
  t, k = weights.shape
  unsorted = jnp.zeros_like(ys).at[order].set(ys, unique_indices=True).reshape(t, k, -1)
  return jnp.sum(weights.astype(ys.dtype)[:, :, None] * unsorted, axis=1)


def experts_forward(
  x: jax.Array,
  logits: jax.Array,
  w_in: jax.Array,
  w_out: jax.Array,
  *,
  top_k: int,
  activation: Callable[[jax.Array], jax.Array],
  gated: bool,
  ragged: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
) -> jax.Array:
  """The MoE output [t, d] of tokens ``x`` [t, d] (module docstring); ``w_in`` [E, d, h or 2h], ``w_out`` [E, h, d];
  ``ragged(lhs, rhs, group_sizes)`` runs each grouped GEMM."""
  weights, experts = route(logits, top_k)
  xs, order, sizes = dispatch(x, experts, w_in.shape[0])
  h = ragged(xs, w_in, sizes)
  if gated:
    gate, up = jnp.split(h, 2, axis=-1)
    h = activation(gate) * up
  else:
    h = activation(h)
  return combine(ragged(h, w_out, sizes), order, weights)
