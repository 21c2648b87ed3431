"""Forward error and gradient alignment of every FP4 recipe on one random SwiGLU MLP layer (a transformer block's MLP).

    y = x + down( silu(gate(x)) ⊙ up(x) ),   loss = ½·mean((y − t)²)

with x ~ N(0, 1) tokens x d (rows scaled by a log-uniform factor in [1/4, 4], as activations vary per token), weights
~ N(0, 1/fan_in), t random. All three projections run through ``fp4jax.einsum`` with the recipe; the exact reference
is the ``bf16`` recipe on float32 inputs (plain ``lax.dot_general``).

Columns: ``fwd relerr`` ‖y − y*‖ / ‖y − x‖ (the MLP's output, residual removed); for the gradients of all weights and
of x: ``cos`` and ``misalign`` (1 − ⟨g*, ĝ⟩/⟨g*, g*⟩) for one key, and ``misalign(mean16)`` of the mean of 16 keys'
gradients (random recipes; an unbiased backward drives it to the forward's own bias).

Run: ``fp4jax-recipe-errors [--tokens 512 --d 256]``.
"""

from __future__ import annotations

import argparse
import datetime

import jax
import jax.numpy as jnp
import numpy as np

import fp4jax
from fp4jax import metrics, recipes

N_KEYS = 16


def init(key, tokens: int, d: int, hidden: int):
  kx, ks, kg, ku, kd, kt = jax.random.split(key, 6)
  row_scale = jnp.exp(jax.random.uniform(ks, (tokens, 1), minval=np.log(0.25), maxval=np.log(4.0)))
  x = jax.random.normal(kx, (tokens, d)) * row_scale
  params = {
    "gate": jax.random.normal(kg, (hidden, d)) / np.sqrt(d),
    "up": jax.random.normal(ku, (hidden, d)) / np.sqrt(d),
    "down": jax.random.normal(kd, (d, hidden)) / np.sqrt(hidden),
  }
  return params, x, jax.random.normal(kt, (tokens, d))


def mlp(params, x, *, recipe, key=None):
  keys = [None] * 3 if key is None else list(jax.random.split(key, 3))
  proj = lambda h, w, k: fp4jax.einsum("tk,nk->tn", h, w, recipe=recipe, key=k)
  h = jax.nn.silu(proj(x, params["gate"], keys[0])) * proj(x, params["up"], keys[1])
  return proj(h, params["down"], keys[2])


def loss(inputs, target, *, recipe, key=None):
  params, x = inputs
  y = x + mlp(params, x, recipe=recipe, key=key)
  return 0.5 * jnp.mean(jnp.square(y - target))


def evaluate(name: str, params, x, target) -> dict[str, float]:
  recipe = recipes.get(name)
  key = jax.random.key(1) if recipe.is_random else None
  out = jax.jit(lambda p, x, k: mlp(p, x, recipe=recipe, key=k))
  exact_out = mlp(params, x, recipe="bf16")
  fwd = jnp.linalg.norm(out(params, x, key) - exact_out) / jnp.linalg.norm(exact_out)
  grad_fn = jax.jit(lambda inputs, t, k: jax.grad(loss)(inputs, t, recipe=recipe, key=k))
  grad = lambda k: grad_fn((params, x), target, k)
  exact = jax.grad(loss)((params, x), target, recipe="bf16")
  g = grad(key)
  row = {"fwd relerr": fwd, "cos": metrics.tree_cosine(exact, g), "misalign": metrics.tree_misalignment(exact, g)}
  if recipe.is_random:
    mean = jax.tree.map(lambda *gs: sum(gs) / N_KEYS, *[grad(k) for k in jax.random.split(key, N_KEYS)])
    row["misalign(mean16)"] = metrics.tree_misalignment(exact, mean)
  return {k: float(v) for k, v in row.items()}


def main(argv=None):
  parser = argparse.ArgumentParser(prog="fp4jax-recipe-errors", description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", type=int, default=512)
  parser.add_argument("--d", type=int, default=256)
  parser.add_argument("--hidden", type=int, default=768)
  args = parser.parse_args(argv)
  params, x, target = init(jax.random.key(0), args.tokens, args.d, args.hidden)
  print(f"# recipe_errors: SwiGLU MLP tokens={args.tokens} d={args.d} hidden={args.hidden}, f32 inputs")
  print(f"# device={jax.devices()[0].device_kind} jax={jax.__version__} date={datetime.date.today()}")
  cols = ("fwd relerr", "cos", "misalign", "misalign(mean16)")
  print("| recipe | " + " | ".join(cols) + " |")
  print("|---" * (len(cols) + 1) + "|")
  for name in recipes.names():
    row = evaluate(name, params, x, target)
    print(f"| {name} | " + " | ".join(f"{row[c]:.4f}" if c in row else "-" for c in cols) + " |", flush=True)


if __name__ == "__main__":
  main()
