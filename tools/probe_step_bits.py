"""Probe (GPU): are the training step's losses reproducible, and are they the same with ``prequantize_weights``?

    python tools/probe_step_bits.py [--model 125M] [--recipe quartet2] [--steps 12] [--batch 16] [--seq-len 1024]

Builds ``fp4jax_experiments.train.Trainer`` as ``benchmarks/train_throughput.py`` does (the stdlib byte corpus, its
first batches and quantization keys), compiles the step once for the default model ("loop") and once with
``prequantize_weights=True`` ("prequantized"), and trains each from the same initial state: "loop" twice with the
same executable, "prequantized" once. It prints every step's loss as a float32 hex string, then the first step at
which each pair of runs differs (``None``: every step the same bits). "loop" against itself tells whether one
executable reproduces its own losses on this machine (cuDNN's attention backward and XLA's atomics may not, unless
``XLA_FLAGS=--xla_gpu_deterministic_ops=true``); "loop" against "prequantized" tells whether the option changes the
losses beyond that. Small shapes (``--model 100K --batch 2 --seq-len 64``) run on the CPU.
"""

import argparse
import time

import jax
import numpy as np

from fp4jax_experiments import train


def losses(trainer: train.Trainer, step, steps: int) -> list[str]:
  """The float32 hex of each of ``steps`` losses, trained from ``trainer``'s initial state with the compiled ``step``
  on the first ``steps`` batches and keys."""
  state, out = trainer.init_state(), []
  for s in range(steps):
    state, metrics = step(state, trainer.place(trainer.stream.batch(s)), trainer.quant_key(s))
    out.append(float(np.float32(metrics["loss"])).hex())
  return out


def first_difference(a: list[str], b: list[str]) -> int | None:
  return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", default="125M")
  p.add_argument("--recipe", default="quartet2")
  p.add_argument("--steps", type=int, default=12)
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq-len", type=int, default=1024)
  args = p.parse_args()
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
  runs = {}
  for name, overrides in (("loop", {}), ("prequantized", {"prequantize_weights": True})):
    trainer = train.Trainer(config, model_overrides=overrides)
    start = time.perf_counter()
    state = trainer.init_state()
    step = trainer.train_step.lower(state, trainer.place(trainer.stream.batch(0)), trainer.quant_key(0)).compile()
    print(f"{name}: compiled in {time.perf_counter() - start:.0f} s", flush=True)
    for again in ("", " again")[: 2 if name == "loop" else 1]:
      runs[name + again] = losses(trainer, step, args.steps)
      print(f"{name + again}: {' '.join(runs[name + again])}", flush=True)
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, {args.model} {args.recipe}", flush=True)
  print(f"first differing step, loop against loop again: {first_difference(runs['loop'], runs['loop again'])}")
  print(f"first differing step, loop against prequantized: {first_difference(runs['loop'], runs['prequantized'])}")


if __name__ == "__main__":
  main()
