"""Probe (GPU): does ``fp4jax.prequantize_weight`` give the dot's own bits at the 125M model's MLP shape?

    python tools/probe_prequantize_bits.py [--small]

For each recipe it prints how many elements differ (0: bit-identical) between the per-layer XLA quantization of a
stack of 12 weights (768 x 2048, bf16) and (a) the stack quantized under ``jax.vmap`` and (b) each layer alone, with
the backends "xla", "pallas" and "auto" (at this size the stack goes through the Pallas kernel under "auto"), then
between one dot's value and gradients (x of 16384 tokens) with the weight quantized in the dot and prequantized.
``--small``: small shapes, for the CPU (the kernels interpreted). The bit tests are in tests/test_prequantize.py and
tests/experiments/test_exp_model.py; this reruns their question at the model's shapes on a GPU.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

import fp4jax

DENSE = (((2,), (0,)), ((), ()))


def differing(xs, ys) -> int:
  """Elements of the pytrees ``xs`` and ``ys`` that differ as float32 (NaN equal to NaN)."""
  bad = 0
  for a, b in zip(jax.tree.leaves(xs), jax.tree.leaves(ys)):
    a, b = np.asarray(jnp.asarray(a, jnp.float32)), np.asarray(jnp.asarray(b, jnp.float32))
    bad += int(np.sum(~((a == b) | (np.isnan(a) & np.isnan(b)))))
  return bad


def prequantizer(recipe: str, backend: str):
  return lambda w: fp4jax.prequantize_weight(w, DENSE, recipe=recipe, backend=backend)


def dot_value_and_grads(recipe: str, x, w, pre):
  def loss(x, w):
    y = fp4jax.dot_general(x, w, DENSE, recipe=recipe, key=jax.random.key(3), rhs_prequantized=pre)
    return jnp.sum(y.astype(jnp.float32) ** 2)

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w)


def main(small: bool) -> None:
  layers, k, n, m = (2, 256, 512, 256) if small else (12, 768, 2048, 16384)
  w = (jax.random.normal(jax.random.key(0), (layers, k, n), jnp.float32) * 0.02).astype(jnp.bfloat16)
  x = jax.random.normal(jax.random.key(1), (1, m, k), jnp.float32).astype(jnp.bfloat16)
  for recipe in ("quartet2", "nvidia_nvfp4", "quartet", "ms_fp4"):
    ref = [jax.jit(prequantizer(recipe, "xla"))(w[i]) for i in range(layers)]
    for backend in ("xla", "pallas", "auto"):
      try:
        stack = jax.jit(jax.vmap(prequantizer(recipe, backend)))(w)
        alone = [jax.jit(prequantizer(recipe, backend))(w[i]) for i in range(layers)]
      except fp4jax.backends.Unsupported as e:
        print(f"{recipe:13s} {backend:6s} refused: {str(e)[:120]}", flush=True)
        continue
      sliced = [jax.tree.map(lambda a, i=i: a[i], stack) for i in range(layers)]
      print(f"{recipe:13s} {backend:6s} vmap {differing(sliced, ref)}, alone {differing(alone, ref)}", flush=True)
    pre = jax.tree.map(lambda a: a[0], jax.jit(jax.vmap(prequantizer(recipe, "auto")))(w))
    a, b = dot_value_and_grads(recipe, x, w[0], None), dot_value_and_grads(recipe, x, w[0], pre)
    print(
      f"{recipe:13s} dot (value, dx, dw): {[differing(u, v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b))]}",
      flush=True,
    )


if __name__ == "__main__":
  main("--small" in sys.argv)
