"""Where one linear layer's fwd+bwd spends its GPU time, per recipe: a JAX profiler trace, summarized per kernel.

Runs ``bench_linear.fwd_bwd`` of ``fp4jax.dot_general`` (``--backend``, default ``auto``) ``--steps`` times under
``jax.profiler.trace`` and writes, per recipe, ``step_profile.summarize``'s busy time per step, kernel launches per
step and the kernels with the most time. The fp4jax it profiles is the one on ``PYTHONPATH``, so the same command
profiles another checkout side by side (``PYTHONPATH=.baseline:.baseline/kernels``).

    python benchmarks/profile_linear.py --recipes nvidia_nvfp4,quartet2 --json out.json     # on a GPU
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

import jax
import jax.numpy as jnp
from bench_linear import DN, fwd_bwd  # a script beside this one (sys.path[0]), as in every tree it profiles
from benchtools import header

import fp4jax
from fp4jax_experiments import step_profile


def profile_recipe(
  recipe: str, backend: str, shape: tuple[int, int, int], steps: int, top: int, hlo: str | None = None
) -> dict:
  """The ``step_profile.summarize`` record of ``steps`` fwd+bwd calls of one ``(m, k) x (n, k)`` layer; ``hlo``: a
  path to write the compiled program's HLO text to (the fusions the profile names)."""
  m, k, n = shape
  kx, kw, kd, kk = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(kx, (m, k), jnp.bfloat16)
  w = jax.random.normal(kw, (n, k), jnp.bfloat16) * 0.02
  dy = jax.random.normal(kd, (m, n), jnp.bfloat16)
  if recipe == "bf16":
    fn = fwd_bwd(lambda a, b, key: jax.lax.dot_general(a, b, DN))
  else:
    fn = fwd_bwd(lambda a, b, key: fp4jax.dot_general(a, b, DN, recipe=recipe, key=key, backend=backend))
  if hlo:
    with open(hlo, "w") as f:
      f.write(fn.lower(x, w, dy, kk).compile().as_text())
  jax.block_until_ready(fn(x, w, dy, kk))  # compile and warm up outside the trace
  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder, create_perfetto_trace=True):
      for _ in range(steps):
        out = fn(x, w, dy, kk)
      jax.block_until_ready(out)
    return step_profile.summarize(step_profile.find_trace(folder), steps=steps, top=top)


def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--recipes", default="bf16,nvfp4_rtn,nvidia_nvfp4,quartet2")
  p.add_argument("--backend", default="auto")
  p.add_argument("--shape", default="8192,4096,4096", help="m,k,n: x is (m, k), w is (n, k)")
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--top", type=int, default=25)
  p.add_argument("--json", default=None)
  p.add_argument("--commit", default=None, help="the profiled tree's commit (the device copy's .git may be stale)")
  p.add_argument("--hlo-dir", default=None, help="write each recipe's compiled HLO to <dir>/<recipe>.hlo.txt")
  args = p.parse_args(argv)
  shape = tuple(int(v) for v in args.shape.split(","))
  doc = {
    "benchmark": "profile_linear",
    "header": header(),
    "commit": args.commit,
    "command": "python benchmarks/profile_linear.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    "fp4jax": fp4jax.__file__,
    "shape": shape,
    "backend": args.backend,
    "steps": args.steps,
    "recipes": {},
  }
  for recipe in args.recipes.split(","):
    hlo = f"{args.hlo_dir}/{recipe}.hlo.txt" if args.hlo_dir else None
    summary = profile_recipe(recipe, args.backend, shape, args.steps, args.top, hlo)
    doc["recipes"][recipe] = summary
    for device, s in summary.items():
      print(f"== {recipe} on {device}: {s['busy_ms_per_step']:.3f} ms busy/step, {s['kernels_per_step']} kernels/step")
      for name, total_ms, calls in s["top"]:
        print(f"  {total_ms / args.steps:8.4f} ms/step  x{calls / args.steps:4.1f}  {name[:110]}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(doc, f, indent=1)


if __name__ == "__main__":
  main()
