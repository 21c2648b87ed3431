"""Benchmark: forward + backward of one linear layer ``Y = X·Wᵀ`` for every recipe, as a ratio to BF16.

Times ``(Y, dX, dW)`` of an M x K by N x K linear (default 8192 x 4096 x 4096, bf16 inputs, bf16 output) under one
``jax.jit`` per recipe: warm-up calls, then the median of ``--iters`` timed calls, each ended by
``block_until_ready``. The ``bf16`` recipe (plain ``lax.dot_general``) is measured in the same run and every ratio is
``time / time_bf16``. ``jax.nn.scaled_dot_general`` with JAX's NVFP4 config (cuDNN block-scaled GEMM on Blackwell,
a dequantize + dot fallback elsewhere; its backward is a plain matmul) is timed as a peer.

fp4jax's quantized GEMMs emulate FP4 in XLA (quantize passes + bf16 GEMMs with fp32 accumulation), so ratios above
1 are expected until native kernels land; the ratio shows the quantization overhead of each recipe.

Run on a GPU: ``python -m experiments.bench_linear``; on CPU (tiny shapes, a smoke test): ``--smoke``.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import jax
import jax.numpy as jnp

import fp4jax
from fp4jax import recipes

DN = (((1,), (1,)), ((), ()))


def fwd_bwd(dot):
  """jit of ``(x, w, dy, key) -> (y, dx, dw)`` for a ``dot(x, w, key)``."""
  def run(x, w, dy, key):
    y, vjp = jax.vjp(lambda a, b: dot(a, b, key), x, w)
    return (y, *vjp(dy))
  return jax.jit(run)


def time_fn(fn, args, warmup: int, iters: int) -> float:
  """Median wall time (s) of ``fn(*args)`` over ``iters`` calls after ``warmup`` calls, each blocked until ready."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def recipe_dot(name):
  return lambda a, b, key: fp4jax.dot_general(a, b, DN, recipe=name, key=key)


def jax_nvfp4_dot(a, b, key):
  del key
  cfg = jax.nn.get_scaled_dot_general_config("nvfp4", jnp.float32(1.0))
  return jax.nn.scaled_dot_general(a, b, DN, preferred_element_type=a.dtype, configs=[cfg, cfg, cfg])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--m", type=int, default=8192)
  parser.add_argument("--k", type=int, default=4096)
  parser.add_argument("--n", type=int, default=4096)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--iters", type=int, default=10)
  parser.add_argument("--recipes", default=",".join(recipes.names()))
  parser.add_argument("--smoke", action="store_true", help="tiny shapes and few iterations (runs on CPU)")
  args = parser.parse_args()
  if args.smoke:
    args.m, args.k, args.n, args.warmup, args.iters = 256, 256, 256, 1, 3

  kx, kw, kd = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (args.m, args.k), jnp.bfloat16)
  w = (jax.random.normal(kw, (args.n, args.k)) / args.k**0.5).astype(jnp.bfloat16)
  dy = jax.random.normal(kd, (args.m, args.n), jnp.bfloat16)
  key = jax.random.key(1)

  dev = jax.devices()[0]
  print(f"# bench_linear: fwd+bwd of X[{args.m}x{args.k}] . W[{args.n}x{args.k}]^T, bf16, median of {args.iters}")
  print(f"# device={dev.platform}:{dev.device_kind} jax={jax.__version__} date={datetime.datetime.now():%Y-%m-%d %H:%M}")
  t_bf16 = time_fn(fwd_bwd(recipe_dot("bf16")), (x, w, dy, key), args.warmup, args.iters)
  print("| recipe | fwd+bwd ms | ratio to bf16 |")
  print("|---|---|---|")
  print(f"| bf16 | {t_bf16 * 1e3:.3f} | 1.00 |", flush=True)
  rows = [(n, recipe_dot(n)) for n in args.recipes.split(",") if n != "bf16"]
  rows.append(("jax.nn.scaled_dot_general nvfp4", jax_nvfp4_dot))
  for name, dot in rows:
    try:
      t = time_fn(fwd_bwd(dot), (x, w, dy, key), args.warmup, args.iters)
    except (NotImplementedError, jax.errors.JaxRuntimeError) as e:  # e.g. scaled_matmul has no CPU lowering
      print(f"| {name} | unavailable on {dev.platform}: {type(e).__name__} | - |", flush=True)
      continue
    print(f"| {name} | {t * 1e3:.3f} | {t / t_bf16:.2f} |", flush=True)


if __name__ == "__main__":
  main()
