"""Are the training step's losses reproducible on this device, and are they the same with ``prequantize_weights``?

    python benchmarks/step_bits.py [--model 125M] [--recipe quartet2] [--steps 12] [--batch 16] [--seq-len 1024]
      [--out benchmarks/results/step_bits_125M_quartet2.json]

Builds ``fp4jax_experiments.train.Trainer`` as ``benchmarks/train_throughput.py`` does (the stdlib byte corpus, its
first batches and quantization keys), compiles the step once with the projections quantizing their weights in the
layer loop ("loop", ``prequantize_weights=False``) and once prequantized ("prequantized"), and trains each from the
same initial state: "loop" twice with the same executable ("loop again"), "prequantized" once. Records every step's
loss as a float32 hex string and the first step at which each pair of runs differs (None: every step the same bits):
"loop" against "loop again" tells whether one executable reproduces its own losses on this device (on a GPU
cuDNN's attention backward and XLA's atomics may not, unless ``XLA_FLAGS=--xla_gpu_deterministic_ops=true``);
"loop" against "prequantized" whether the option changes the losses beyond that. Small shapes (``--model 100K
--batch 2 --seq-len 64``) run on the CPU.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

if __package__ in (None, ""):  # run as a script: the repository root makes ``benchmarks`` importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.benchtools import command_line, commit, provenance, write_json
from fp4jax_experiments import train

REPO = pathlib.Path(__file__).resolve().parents[1]
RUNS = (("loop", {"prequantize_weights": False}, 2), ("prequantized", {"prequantize_weights": True}, 1))
PAIRS = (("loop", "loop again"), ("loop", "prequantized"))


def losses(trainer: train.Trainer, step, steps: int) -> list[str]:
  """The float32 hex of each of ``steps`` losses, trained from ``trainer``'s initial state with the compiled ``step``
  on the first ``steps`` batches and keys."""
  state, out = trainer.init_state(), []
  for s in range(steps):
    state, metrics = step(state, trainer.place(trainer.stream.batch(s)), trainer.quant_key(s))
    out.append(float(np.float32(metrics["loss"])).hex())
  return out


def first_difference(a: list[str], b: list[str]) -> int | None:
  """The first index at which ``a`` and ``b`` differ, None where they agree throughout."""
  return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", default="125M")
  p.add_argument("--recipe", default="quartet2")
  p.add_argument("--steps", type=int, default=12)
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq-len", type=int, default=1024)
  p.add_argument("--out", default=None, help="JSON (default: benchmarks/results/step_bits_<model>_<recipe>.json)")
  p.add_argument("--commit", default=None, help="the commit to record (default: git's HEAD)")
  args = p.parse_args(argv)
  for name in ("steps", "batch", "seq_len"):
    if getattr(args, name) < 1:
      p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
  out = args.out or REPO / "benchmarks" / "results" / f"step_bits_{args.model}_{args.recipe}.json"
  config = train.TrainConfig(
    model=args.model,
    recipe=args.recipe,
    data="stdlib",
    batch_size=args.batch,
    seq_len=args.seq_len,
    tokens=args.batch * args.seq_len * args.steps,
    log_every=1,
    ckpt_every=1,
  )
  runs, compile_s = {}, {}
  for name, overrides, times in RUNS:
    trainer = train.Trainer(config, model_overrides=overrides)
    start = time.perf_counter()
    state = trainer.init_state()
    step = trainer.train_step.lower(state, trainer.place(trainer.stream.batch(0)), trainer.quant_key(0)).compile()
    compile_s[name] = time.perf_counter() - start
    for label in (name, f"{name} again")[:times]:
      runs[label] = losses(trainer, step, args.steps)
      print(f"{label}: {' '.join(runs[label])}", flush=True)
  differences = {f"{a} / {b}": first_difference(runs[a], runs[b]) for a, b in PAIRS}
  for pair, first in differences.items():
    print(f"first differing step, {pair}: {first}")
  doc = {
    "benchmark": "step_bits",
    **provenance(args.commit or commit(), command_line("benchmarks/step_bits.py", argv or sys.argv[1:])),
    "settings": {
      "model": args.model,
      "recipe": args.recipe,
      "steps": args.steps,
      "batch": args.batch,
      "seq_len": args.seq_len,
    },
    "compile_s": compile_s,
    "losses": runs,
    "first_difference": differences,
  }
  write_json(out, doc)


if __name__ == "__main__":
  main()
