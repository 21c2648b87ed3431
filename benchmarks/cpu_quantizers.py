"""The XLA quantizers on the CPU, this tree against another checkout, side by side in alternating processes.

    python benchmarks/cpu_quantizers.py --baseline /tmp/oldtree --baseline-commit 7dacbae --rounds 2

Each run (one process per tree and round, ``PYTHONPATH`` the tree and its ``kernels``; each round swaps which tree runs
first) times ``fp4jax.operand.rotate_and_quantize(x, spec, key, signs, backend="xla")`` under ``jax.jit`` for the
forward-X (``fwd_lhs``) and dgrad-dY (``dgrad_lhs``) operands of each recipe, ``x`` a (``--rows``, ``--cols``)
bfloat16 normal tensor: the median of ``--repeats`` calls after one warm-up call. The quantized outputs' checksum
(the sum of every output's absolute values) shows whether the two trees computed the same thing. The JSON under
``benchmarks/results/`` is rewritten after every round: per row the median ms of each tree over the rounds, every
round's value and the ratio this tree / baseline (across processes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
OPERANDS = ("fwd_lhs", "dgrad_lhs")


def measure(recipes: list[str], rows: int, cols: int, repeats: int) -> dict[str, dict]:
  """{"recipe operand": {"ms": median ms per call, "checksum": float}} in this process (the fp4jax it imports)."""
  import jax
  import jax.numpy as jnp

  from fp4jax._src import operand
  from fp4jax._src import recipes as recipes_lib

  x = jax.random.normal(jax.random.key(0), (rows, cols), jnp.bfloat16)
  key = jax.random.key(1)
  out = {}
  for name in recipes:
    for op in OPERANDS:
      spec = getattr(recipes_lib.get(name), op)
      signs = jnp.ones((spec.hadamard,), jnp.float32) if spec.hadamard else None
      fn = jax.jit(
        lambda x, spec=spec, signs=signs: jax.tree.leaves(
          operand.rotate_and_quantize(x, spec, key, signs, backend="xla")
        )
      )
      jax.block_until_ready(fn(x))
      times = []
      for _ in range(repeats):
        start = time.perf_counter()
        result = jax.block_until_ready(fn(x))
        times.append((time.perf_counter() - start) * 1e3)
      checksum = float(sum(jnp.sum(jnp.abs(leaf.astype(jnp.float32))) for leaf in result))
      out[f"{name} {op}"] = {"ms": statistics.median(times), "checksum": checksum}
  return out


def run_tree(root: pathlib.Path, args) -> dict[str, dict]:
  """:func:`measure` in a fresh process importing ``root``'s fp4jax."""
  cmd = [sys.executable, str(pathlib.Path(__file__)), "--worker", "--recipes", args.recipes, "--rows", str(args.rows),
         "--cols", str(args.cols), "--repeats", str(args.repeats)]  # fmt: skip
  env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'kernels'}"}
  out = subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, text=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def rows_of(runs: dict[str, list[dict]]) -> list[dict]:
  """Per measured name: each tree's rounds, their medians, the ratio this / baseline and whether every checksum of
  both trees is the same."""
  rows = []
  for name in runs["this"][0]:
    this = [r[name]["ms"] for r in runs["this"]]
    base = [r[name]["ms"] for r in runs["baseline"]]
    sums = {r[name]["checksum"] for tree in runs.values() for r in tree}
    rows.append({"name": name, "this_ms": statistics.median(this), "baseline_ms": statistics.median(base),
                 "ratio": statistics.median(this) / statistics.median(base), "this_rounds": this,
                 "baseline_rounds": base, "same_output": len(sums) == 1})  # fmt: skip
  return rows


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--baseline", help="folder with the other commit's fp4jax/ and kernels/")
  p.add_argument("--baseline-commit", default="unknown", help="the commit the baseline folder holds")
  p.add_argument("--recipes", default="nvidia_nvfp4,quartet2", help="comma-separated recipe names")
  p.add_argument("--rows", type=int, default=2048)
  p.add_argument("--cols", type=int, default=256)
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--commit", default=None, help="this tree's commit (default: git rev-parse)")
  p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "cpu_quantizers.json"))
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  return p


def main(argv=None):
  p = _parser()
  args = p.parse_args(argv)
  for flag in ("rows", "cols", "repeats", "rounds"):
    if getattr(args, flag) < 1:
      p.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
  if args.worker:
    print(json.dumps(measure(args.recipes.split(","), args.rows, args.cols, args.repeats)))
    return
  if args.baseline is None or not (pathlib.Path(args.baseline) / "fp4jax" / "_src" / "operand.py").is_file():
    p.error(f"--baseline {args.baseline}: expected a folder holding another commit's fp4jax/ and kernels/")
  sys.path.insert(0, str(REPO))  # the driver's own imports (the workers import each tree's fp4jax)
  from benchmarks.benchtools import commit, header
  from fp4jax_experiments import train

  trees = {"this": REPO, "baseline": pathlib.Path(args.baseline).resolve()}
  runs: dict[str, list[dict]] = {"this": [], "baseline": []}
  for r in range(args.rounds):
    for tree in list(trees) if r % 2 == 0 else list(reversed(trees)):
      runs[tree].append(run_tree(trees[tree], args))
    doc = {
      "benchmark": "cpu_quantizers",
      "header": header(),
      "commit": args.commit or commit(),
      "baseline_commit": args.baseline_commit,
      "date": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
      "command": " ".join(["python", "benchmarks/cpu_quantizers.py", *(argv if argv is not None else sys.argv[1:])]),
      "settings": {"rows": args.rows, "cols": args.cols, "repeats": args.repeats, "rounds": r + 1},
      "rows": rows_of(runs),
    }
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    train.write_atomic(pathlib.Path(args.out), json.dumps(doc, indent=1) + "\n")
  for row in doc["rows"]:
    print(f"{row['name']}: {row['this_ms']:.1f} ms vs {row['baseline_ms']:.1f} ms ({row['ratio']:.3f})")


if __name__ == "__main__":
  main()
