"""A recipe's training step with and without one op's Pallas implementation, side by side in one process.

    python benchmarks/pallas_ablation.py --op select_ranks --recipe ms_fp4        # GPU: the 125M step
    python benchmarks/pallas_ablation.py --op select_ranks --recipe ms_fp4 --model 100K --batch 2 --seq-len 64 \\
      --warmup 1 --steps 1 --rounds 1 --out runs/ablation.json                     # CPU smoke (XLA both times)
    python benchmarks/pallas_ablation.py --op inverse_rotate --recipe quartet

``fp4jax_experiments.train.Trainer`` of ``--model`` under ``--recipe`` on one device
(``benchmarks/train_throughput.py``'s experiments entry), built twice: as the library runs it (``"auto"``: the op's
Pallas implementation where the GPU runs it and it takes the case; variant ``pallas``) and with that implementation
unregistered (variant ``xla``). Both are compiled, warmed up with ``--warmup`` steps, then timed in ``--rounds``
interleaved rounds of ``--steps`` steps. Per variant: ms per step of each round, tokens/s of the median round, compile
seconds, the last loss, and how many times its trace called the Pallas implementation (0 where ``"auto"`` picks XLA,
e.g. off a GPU). Ops: the registry's names with a Pallas implementation (``fp4jax.estimators.SELECT_OP``, ...).
Writes ``benchmarks/results/pallas_ablation_<op>_<recipe>.json``.
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import statistics
import sys

if __package__ in (None, ""):  # run as a script: the repository root makes ``benchmarks`` importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import train_throughput
from benchmarks.benchtools import commit, provenance, write_json
from fp4jax._src import backends

REPO = pathlib.Path(__file__).resolve().parents[1]


def rows(
  op: str, recipe: str, model: str, batch: int, seq_len: int, data: str, warmup: int, steps: int, rounds: int
) -> list[dict]:
  """The two variants' rows (module docstring); the registry is left as it was, also when a build fails.

  Raises:
    ValueError: ``op`` has no Pallas implementation registered (after loading the kernels).
  """
  backends.load_plugins()
  pallas = backends.implementation(op, "pallas")
  if pallas is None:
    raise ValueError(f"--op {op!r} has no 'pallas' implementation; ops with one: see fp4jax_kernels.__init__")
  calls = {"n": 0}

  def counted(*args, **kwargs):  # counts the cases a trace hands the kernel (before it may refuse them)
    calls["n"] += 1
    return pallas(*args, **kwargs)

  entries, traced, total = [], [], warmup + steps * rounds
  try:
    for variant in ("pallas", "xla"):
      if variant == "pallas":
        backends.register(op, "pallas", counted)
      else:
        backends.unregister(op, "pallas")
      calls["n"] = 0
      entries.append(train_throughput.experiments_entry(variant, recipe, model, 1, batch, seq_len, total, data, {}))
      traced.append(calls["n"])
  finally:
    backends.register(op, "pallas", pallas)
  for entry in entries:
    entry.advance(warmup)
  for _ in range(rounds):
    for entry in entries:
      entry.step_seconds.append(entry.advance(steps) / steps)
  return [
    {
      "variant": e.model,
      "pallas_calls_traced": n,
      "ms_per_step_rounds": [1e3 * t for t in e.step_seconds],
      "tokens_per_s": batch * seq_len / statistics.median(e.step_seconds),
      "compile_s": e.compile_s,
      "loss": e.loss,
    }
    for e, n in zip(entries, traced)
  ]


def _positive(text: str) -> int:
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
  return value


def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--op", required=True, help="a registry op with a Pallas implementation, e.g. select_ranks")
  p.add_argument("--recipe", required=True)
  p.add_argument("--model", default="125M")
  p.add_argument("--batch", type=_positive, default=16)
  p.add_argument("--seq-len", type=_positive, default=1024)
  p.add_argument("--data", default="stdlib", help="a byte corpus (fp4jax_experiments.data.load_corpus)")
  p.add_argument("--warmup", type=_positive, default=3)
  p.add_argument("--steps", type=_positive, default=10)
  p.add_argument("--rounds", type=_positive, default=3)
  p.add_argument("--commit", default=None, help="default: git rev-parse of this checkout")
  p.add_argument("--out", type=pathlib.Path, default=None)
  args = p.parse_args(argv)
  out = args.out or REPO / "benchmarks" / "results" / f"pallas_ablation_{args.op}_{args.recipe}.json"
  command = shlex.join(["python", "benchmarks/pallas_ablation.py", *(argv if argv is not None else sys.argv[1:])])
  settings = {k: getattr(args, k) for k in ("op", "recipe", "model", "batch", "seq_len", "data")}
  doc = {
    "benchmark": "pallas_ablation",
    **provenance(args.commit or commit(), command),
    "settings": settings,
    "rows": rows(**settings, warmup=args.warmup, steps=args.steps, rounds=args.rounds),
  }
  write_json(out, doc)
  for r in doc["rows"]:
    print(
      f"{args.recipe} {args.model} step, {r['variant']}: {r['ms_per_step_rounds']} ms, {r['pallas_calls_traced']} "
      f"Pallas calls traced"
    )


if __name__ == "__main__":
  main()
