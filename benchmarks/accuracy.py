"""Quantization-error and recipe-accuracy tables as JSON result files for ``benchmarks/report.py``.

Numerics, not timings: the values depend on the code and the seeds, not on the machine's load, so a CPU run is a
valid measurement (the GPU gives the same values within the float32 summation order).

    python benchmarks/accuracy.py --commit $(git rev-parse --short HEAD)

writes ``benchmarks/results/quant_error.json`` (``fp4jax_experiments.quant_error_table.measure``: Quartet II's
table, mean and sample standard deviation over ``--keys`` keys) and ``benchmarks/results/recipe_errors.json``
(``fp4jax_experiments.recipe_errors.evaluate`` on every recipe of ``fp4jax.recipes.names()``).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

if __package__ in (None, ""):  # run as a script: the repository root makes ``benchmarks`` importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax

from benchmarks.benchtools import provenance, write_json
from fp4jax import recipes
from fp4jax_experiments import quant_error_table, recipe_errors

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def quant_error(rows: int, keys: int, where: dict) -> dict:
  """Quartet II's table: per quantizer the relative MSE and misalignment, mean and sd over keys, and the paper's."""
  out = []
  for name, (mse, mse_sd, mis, mis_sd) in quant_error_table.measure(rows, keys).items():
    pub_mse, pub_mis = quant_error_table.PUBLISHED[name]
    out.append(
      {
        "name": name,
        "rel_mse": float(mse),
        "rel_mse_sd": float(mse_sd),
        "misalignment": float(mis),
        "misalignment_sd": float(mis_sd),
        "published_rel_mse": None if pub_mse is None else pub_mse * 1e-3,
        "published_misalignment": pub_mis,
      }
    )
  return {"benchmark": "quant_error", **where, "settings": {"rows": rows, "keys": keys}, "rows": out}


def recipe_accuracy(tokens: int, d: int, hidden: int, where: dict) -> dict:
  """Forward error and gradient alignment of every recipe on one SwiGLU MLP."""
  params, x, target = recipe_errors.init(jax.random.key(0), tokens, d, hidden)
  out = [{"recipe": name, **recipe_errors.evaluate(name, params, x, target)} for name in recipes.names()]
  settings = {"tokens": tokens, "d": d, "hidden": hidden, "mean_keys": recipe_errors.N_KEYS}
  return {"benchmark": "recipe_errors", **where, "settings": settings, "rows": out}


def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--commit", required=True, help="the commit measured (recorded in the JSON)")
  p.add_argument("--rows", type=int, default=4096, help="rows of 128 values in the quantization-error table")
  p.add_argument("--keys", type=int, default=8, help="independent keys of the quantization-error table")
  p.add_argument("--tokens", type=int, default=512, help="tokens of the recipe-accuracy MLP's input")
  p.add_argument("--d", type=int, default=256, help="model width of the recipe-accuracy MLP")
  p.add_argument("--hidden", type=int, default=768, help="hidden width of the recipe-accuracy MLP")
  p.add_argument("--out", type=pathlib.Path, default=RESULTS, help="folder the two JSON files are written to")
  a = p.parse_args(argv)
  values = f"--rows {a.rows} --keys {a.keys} --tokens {a.tokens} --d {a.d} --hidden {a.hidden}"
  where = provenance(a.commit, f"python benchmarks/accuracy.py --commit {a.commit} {values}")
  docs = {
    "quant_error.json": quant_error(a.rows, a.keys, where),
    "recipe_errors.json": recipe_accuracy(a.tokens, a.d, a.hidden, where),
  }
  for name, doc in docs.items():
    write_json(a.out / name, doc)
    print(f"wrote {a.out / name}")


if __name__ == "__main__":
  main()
