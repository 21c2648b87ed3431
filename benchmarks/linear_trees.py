"""One linear layer fwd+bwd under every recipe with default arguments, this tree against another checkout, side by side.

Runs ``benchmarks/bench_linear.py --backends auto`` alternately from this checkout and from ``--baseline`` (a folder
holding another commit's ``fp4jax``, ``kernels`` and ``benchmarks``), ``--rounds`` times each, in separate processes
on the same GPU (each round swaps which tree runs first), and writes one JSON document under
``benchmarks/results/`` after every round: per recipe the median ms of each tree over the rounds, every round's
value and the ratio this tree / baseline.

    python benchmarks/linear_trees.py --baseline .baseline --rounds 2     # on a GPU
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
import tempfile

if __package__ in (None, ""):  # run as a script: the repository root makes ``benchmarks`` importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import benchtools
from fp4jax_experiments import train

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_tree(root: pathlib.Path, python_path: str, extra: list[str]) -> dict:
  """The JSON document of one ``bench_linear.py`` run from ``root`` with ``PYTHONPATH=python_path``."""
  with tempfile.NamedTemporaryFile(suffix=".json") as out:
    cmd = [
      sys.executable,
      str(root / "benchmarks" / "bench_linear.py"),
      "--backends",
      "auto",
      "--json",
      out.name,
      *extra,
    ]
    env = {**os.environ, "PYTHONPATH": python_path}
    subprocess.run(cmd, cwd=root, env=env, check=True, stdout=sys.stderr)
    return json.loads(pathlib.Path(out.name).read_text())


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--baseline", required=True, help="folder with the other commit's fp4jax/, kernels/, benchmarks/")
  p.add_argument("--baseline-commit", default="unknown", help="the commit the baseline folder holds")
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument(
    "--commit", default=None, help="this tree's commit (default: git rev-parse; a copied tree's .git may be stale)"
  )
  p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "linear_trees.json"))
  p.add_argument("bench_args", nargs="*", help="passed to bench_linear.py (after --)")
  args = p.parse_args(argv)
  if args.rounds < 1:
    p.error(f"--rounds must be at least 1, got {args.rounds}")
  base = pathlib.Path(args.baseline).resolve()
  if not (base / "benchmarks" / "bench_linear.py").is_file():
    p.error(f"--baseline {args.baseline}: expected a folder holding another commit's benchmarks/bench_linear.py")
  trees = {
    "this": (REPO, os.environ.get("PYTHONPATH", "")),
    "baseline": (base, f"{base}{os.pathsep}{base / 'kernels'}"),
  }
  ms: dict[str, dict[str, list[float]]] = {"this": {}, "baseline": {}}
  header = None
  for r in range(args.rounds):
    order = list(trees) if r % 2 == 0 else list(reversed(trees))  # alternate which tree runs first in a round
    for tree in order:
      root, path = trees[tree]
      doc = run_tree(root, path, args.bench_args)
      header = header or doc["header"]
      for row in doc["rows"]:
        if "ms" in row:
          ms[tree].setdefault(row["name"], []).append(row["ms"])
    rows = write(args, argv, header, ms, rounds=r + 1)  # after every round: a run cut short keeps what it measured
  print("| linear fwd+bwd, default arguments | this ms | baseline ms | this / baseline |")
  print("|---|---|---|---|")
  for row in rows:
    print(f"| {row['name']} | {row['this_ms']:.3f} | {row['baseline_ms']:.3f} | {row['ratio']:.3f} |")


def write(args, argv, header, ms, rounds: int) -> list[dict]:
  """Write the JSON document of the ``rounds`` completed rounds to ``args.out``; returns its rows."""
  rows = []
  for name in ms["this"]:
    this, other = statistics.median(ms["this"][name]), statistics.median(ms["baseline"].get(name, [float("nan")]))
    rows.append(
      {
        "name": name,
        "this_ms": this,
        "baseline_ms": other,
        "ratio": this / other,
        "this_rounds": ms["this"][name],
        "baseline_rounds": ms["baseline"].get(name, []),
      }
    )
  doc = {
    "benchmark": "linear_trees",
    "header": header,
    "commit": args.commit or benchtools.commit(),
    "baseline_commit": args.baseline_commit,
    "date": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
    "command": " ".join(["python", "benchmarks/linear_trees.py", *(argv if argv is not None else sys.argv[1:])]),
    "rounds": rounds,
    "rows": rows,
  }
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  train.write_atomic(pathlib.Path(args.out), json.dumps(doc, indent=1) + "\n")
  return rows


if __name__ == "__main__":
  main()
