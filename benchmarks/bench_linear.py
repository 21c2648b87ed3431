"""Linear layer fwd+bwd of every recipe and quantizer backend (``fp4jax.dot_general(..., backend="xla" | "pallas")``)
as a ratio to bf16.

Times ``(Y, dX, dW)`` of ``Y = X·Wᵀ`` (default 8192 x 4096 x 4096, bf16 inputs and output) under one ``jax.jit`` per
row with ``benchtools.time_ms`` (median of repeats of 10 back-to-back calls, synchronized once);
every ratio is to the plain bf16 ``lax.dot_general`` measured in the same run. ``jax.nn.scaled_dot_general`` with
JAX's NVFP4 config is a peer row. For each recipe it also checks that the Pallas and XLA backends give the same bits
(Y, dX, dW compared exactly, same key; those that differ are named with their largest relative difference). The
GEMMs are XLA bf16 dots on both backends; the backend changes the quantizers only (see ``fp4jax.operand``).

    python benchmarks/bench_linear.py [--json linear.json]     # on a GPU
    python benchmarks/bench_linear.py --smoke                 # CPU: tiny, interpret mode

A recipe the Pallas backend cannot quantize (no block-FP4 operand: bf16, fp8, mxfp8, fp8_block, ms_fp4) gets an
"unavailable" row.

Prints a markdown table and one JSON document (also written to ``--json``).
"""

from __future__ import annotations

import argparse
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from benchtools import header, time_ms

import fp4jax

DN = (((1,), (1,)), ((), ()))


def fwd_bwd(dot):
  """jit of ``(x, w, dy, key) -> (y, dx, dw)`` for ``dot(x, w, key)``."""

  def run(x, w, dy, key):
    y, vjp = jax.vjp(lambda a, b: dot(a, b, key), x, w)
    return (y, *vjp(dy))

  return jax.jit(run)


def recipe_dot(recipe: str, backend: str):
  return lambda a, b, key: fp4jax.dot_general(a, b, DN, recipe=recipe, key=key, backend=backend)


def jax_nvfp4_dot(a, b, key):
  del key
  cfg = jax.nn.get_scaled_dot_general_config("nvfp4", jnp.float32(1.0))
  return jax.nn.scaled_dot_general(a, b, DN, preferred_element_type=a.dtype, configs=[cfg, cfg, cfg])


def differing(got, want) -> list[str]:
  """Which of Y, dX, dW differ in any bit between two backends' outputs, each with its largest difference relative
  to the output's max |value| (a GEMM algorithm picked differently moves the last bits; a changed FP4 operand
  moves whole quantization steps)."""
  out = []
  for name, g, w in zip(("Y", "dX", "dW"), got, want):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    if not np.array_equal(g, w, equal_nan=True):
      out.append(f"{name} {np.nanmax(np.abs(g - w)) / max(np.nanmax(np.abs(w)), 1e-30):.1e}")
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--m", type=int, default=8192)
  p.add_argument("--k", type=int, default=4096)
  p.add_argument("--n", type=int, default=4096)
  p.add_argument("--recipes", default=",".join(n for n in fp4jax.recipes.names() if n != "bf16"))
  p.add_argument("--backends", default="xla,pallas")
  p.add_argument("--json", default=None, help="also write the JSON document to this path")
  p.add_argument("--smoke", action="store_true", help="tiny shapes, one timed call (CPU; Pallas in interpret mode)")
  args = p.parse_args()
  timer = time_ms
  if args.smoke:
    args.m, args.k, args.n = 128, 128, 128
    timer = functools.partial(time_ms, warmup=1, repeats=1, calls=1)

  kx, kw, kd = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (args.m, args.k), jnp.bfloat16)
  w = (jax.random.normal(kw, (args.n, args.k)) / args.k**0.5).astype(jnp.bfloat16)
  dy = jax.random.normal(kd, (args.m, args.n), jnp.bfloat16)
  key = jax.random.key(1)
  operands = (x, w, dy, key)

  print(header(), flush=True)
  bf16_ms = timer(fwd_bwd(recipe_dot("bf16", "xla")), *operands)
  rows = [{"name": "bf16 lax.dot_general", "recipe": "bf16", "backend": "xla", "ms": bf16_ms}]
  for recipe in args.recipes.split(","):
    outputs = {}
    for backend in args.backends.split(","):
      fn = fwd_bwd(recipe_dot(recipe, backend))
      try:
        outputs[backend] = jax.block_until_ready(fn(*operands))
      except ValueError as e:
        if f"backend={backend!r}" not in str(e):  # only the backend's refusal of this recipe's operands is a row
          raise
        rows.append({"name": f"{recipe} [{backend}]", "unavailable": str(e)[:200]})
        continue
      rows.append({"name": f"{recipe} [{backend}]", "recipe": recipe, "backend": backend, "ms": timer(fn, *operands)})
      print(f"{rows[-1]['name']}: {rows[-1]['ms']:.3f} ms", flush=True)
    if {"xla", "pallas"} <= outputs.keys():
      for r in rows:
        if r.get("recipe") == recipe:
          diff = differing(outputs["pallas"], outputs["xla"])
          r["same_bits_pallas_xla"] = not diff
          r["differing_outputs"] = diff
  try:
    rows.append(
      {
        "name": "jax.nn.scaled_dot_general nvfp4",
        "recipe": None,
        "backend": "jax",
        "ms": timer(fwd_bwd(jax_nvfp4_dot), *operands),
      }
    )
  except (NotImplementedError, jax.errors.JaxRuntimeError) as e:  # no lowering on this device
    rows.append({"name": "jax.nn.scaled_dot_general nvfp4", "unavailable": f"{type(e).__name__}: {str(e)[:200]}"})
  for r in rows:
    if "ms" in r:
      r["ratio_to_bf16"] = r["ms"] / bf16_ms

  print("| linear fwd+bwd | backend | ms | ratio to bf16 | pallas == xla bits |")
  print("|---|---|---|---|---|")
  for r in rows:
    if "ms" not in r:
      print(f"| {r['name']} | - | unavailable | - | - |")
      continue
    same = r.get("same_bits_pallas_xla", "")
    if r.get("differing_outputs"):
      same = f"no: {', '.join(r['differing_outputs'])}"
    print(f"| {r['name']} | {r['backend']} | {r['ms']:.3f} | {r['ratio_to_bf16']:.2f} | {same} |")
  doc = {
    "header": header(),
    "shape": {"m": args.m, "k": args.k, "n": args.n},
    "dtype": "bfloat16",
    "timing": "benchtools.time_ms: median of repeats of back-to-back calls",
    "rows": rows,
  }
  text = json.dumps(doc, indent=1)
  print(text)
  if args.json:
    with open(args.json, "w") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  main()
