"""Whether a change of how the experiments model computes keeps its loss curve: ModelConfig variants side by side.

    python benchmarks/loss_curves.py --variants '{"none": {"recompute": "none"}, "norms": {"recompute": "norms"}}'

Trains ``fp4jax_experiments.train.Trainer`` (``--model``, ``--recipe``, batch x sequence, the same data, seed and
quantization keys) for ``--steps`` steps once per variant and round, ``--rounds`` rounds, in one process on one
device, recording every step's loss. Two runs of one variant differ only by the device's run-to-run noise (e.g.
cuDNN's attention backward); a variant keeps the curve when it differs from the first variant by no more than that.
The JSON (under ``benchmarks/results/`` or ``--out``, rewritten after every run) holds every loss and, per pair of
runs, the mean and largest absolute difference over the steps and the difference at the last step.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import pathlib
import sys

if __package__ in (None, ""):  # run as a script: the repository root makes ``benchmarks`` importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks.benchtools import commit, header
from fp4jax_experiments import train

REPO = pathlib.Path(__file__).resolve().parents[1]


def curve(model: str, recipe: str, batch: int, seq_len: int, steps: int, overrides: dict) -> list[float]:
  """The loss of every step of one run."""
  config = train.TrainConfig(
    model=model,
    recipe=recipe,
    data="stdlib",
    batch_size=batch,
    seq_len=seq_len,
    tokens=batch * seq_len * steps,
    log_every=1,
    ckpt_every=10**9,
  )
  trainer = train.Trainer(config, model_overrides=overrides)
  state = trainer.init_state()
  step = trainer.train_step
  losses = []
  for s in range(steps):
    state, metrics = step(state, trainer.place(trainer.stream.batch(s)), trainer.quant_key(s))
    losses.append(float(metrics["loss"]))
  return losses


def differences(runs: dict[str, list[float]]) -> list[dict]:
  """Per pair of runs: mean and largest |difference| over the steps, and the difference at the last step."""
  out = []
  for a, b in itertools.combinations(runs, 2):
    d = np.asarray(runs[a]) - np.asarray(runs[b])
    out.append({"a": a, "b": b, "mean_abs": float(np.mean(np.abs(d))), "max_abs": float(np.max(np.abs(d))),
                "last": float(d[-1])})  # fmt: skip
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--variants", type=json.loads, required=True, help="JSON {label: ModelConfig overrides}")
  p.add_argument("--model", default="125M")
  p.add_argument("--recipe", default="bf16")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq-len", type=int, default=1024)
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--rounds", type=int, default=2, help="runs per variant (>= 2 measures the run-to-run noise)")
  p.add_argument("--commit", default=None, help="this tree's commit (default: git rev-parse)")
  p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "loss_curves.json"))
  args = p.parse_args(argv)
  variants = args.variants
  if not isinstance(variants, dict) or not variants or not all(isinstance(v, dict) for v in variants.values()):
    p.error(f"--variants must be a non-empty JSON object of ModelConfig overrides, got {variants!r}")
  for flag in ("steps", "rounds"):
    if getattr(args, flag) < 1:
      p.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
  doc = {
    "benchmark": "loss_curves",
    "header": header(),
    "commit": args.commit or commit(),
    "date": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
    "command": " ".join(["python", "benchmarks/loss_curves.py", *(argv if argv is not None else sys.argv[1:])]),
    "settings": {k: getattr(args, k) for k in ("model", "recipe", "batch", "seq_len", "steps", "rounds", "variants")},
    "runs": {},
  }
  for r in range(args.rounds):
    for label, overrides in args.variants.items():
      name = f"{label}#{r + 1}"
      doc["runs"][name] = curve(args.model, args.recipe, args.batch, args.seq_len, args.steps, overrides)
      doc["differences"] = differences(doc["runs"])
      pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
      train.write_atomic(pathlib.Path(args.out), json.dumps(doc, indent=1) + "\n")
      print(f"{name}: loss {doc['runs'][name][0]:.4f} -> {doc['runs'][name][-1]:.4f}", flush=True)
  for d in doc["differences"]:
    print(f"{d['a']} vs {d['b']}: mean |Δ| {d['mean_abs']:.4f}, max {d['max_abs']:.4f}, last {d['last']:+.4f}")


if __name__ == "__main__":
  main()
