"""Weak-scaling benchmark of sharded training: tokens/s on 1, 2, 4, ... devices at a fixed per-device batch.

  fp4jax-bench-scaling --model 125M --recipes bf16,nvidia_nvfp4,quartet2 --devices 1,2,4 \\
      --per-device-batch 8 --seq-len 1024 --mesh data --out runs/bench_scaling.json
  fp4jax-bench-scaling --smoke        # CPU: 100K model, 1 and 2 host devices, a few steps

Each point compiles the train step (timed: ``compile_s``, lowering included; with JAX's persistent compilation cache
on, a cached program loads instead), then trains ``--steps`` timed steps (after ``--warmup`` untimed ones) of
``fp4jax_experiments.train.Trainer`` on a mesh of n devices: ``--mesh data`` (data parallel, global batch n x per-device
batch), ``fsdp`` (the same with sharded parameters) or ``model`` (tensor parallel over n devices, global batch = the
per-device batch x 1). Batches are placed on the devices before timing, so the numbers are compute + communication.
Weak-scaling efficiency = tokens/s(n) / (n · tokens/s(1)) for data / fsdp; for ``model`` it is the speed-up
tokens/s(n) / tokens/s(1) divided by n.

MFU = tokens/s · FLOPs per token / (n · R), with FLOPs per token = 6·N + 12·L·d·T (N all parameters, L layers,
d width, T sequence length: the matmuls of the forward and backward pass, attention included) and R the bf16 GEMM
rate measured at the start of the same run (``--matmul-size``³, bf16 in, fp32 accumulate).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp

from fp4jax_experiments import deterministic, sharding, step_profile, train
from fp4jax_experiments import model as model_lib

MESH_KINDS = ("data", "fsdp", "model")


def layout_for(kind: str, n: int) -> sharding.Layout:
  if kind not in MESH_KINDS:
    raise ValueError(f"mesh kind must be one of {MESH_KINDS}, got {kind!r}")
  if kind == "model":
    return sharding.Layout(model=n)
  return sharding.Layout(data=n, fsdp=kind == "fsdp" and n > 1)


def matmul_tflops(size: int, repeats: int = 20) -> float:
  """The bf16 GEMM rate of one device (TFLOP/s): ``size``³, bf16 operands, fp32 accumulation, bf16 output."""
  a = jax.random.normal(jax.random.key(0), (size, size), jnp.bfloat16)
  b = jax.random.normal(jax.random.key(1), (size, size), jnp.bfloat16)
  f = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
  jax.block_until_ready(f(a, b))
  best = float("inf")
  for _ in range(3):
    start = time.perf_counter()
    jax.block_until_ready([f(a, b) for _ in range(repeats)])
    best = min(best, (time.perf_counter() - start) / repeats)
  return 2 * size**3 / best / 1e12


def flops_per_token(model: str, seq_len: int) -> float:
  """6·N + 12·L·d·T: the training FLOPs of one token (see the module docstring); N counts the parameters one token
  runs through (an MoE block's router and top_k experts, ``parameter_count``'s "active_non_embedding", plus the
  embeddings)."""
  config = model_lib.model_config(model)
  counts = model_lib.parameter_count(config)
  n = counts["total"] - counts["non_embedding"] + counts["active_non_embedding"]
  return 6 * n + 12 * config.n_layers * config.d_model * seq_len


def measure(
  recipe: str,
  model: str,
  n: int,
  kind: str,
  per_device_batch: int,
  seq_len: int,
  steps: int,
  warmup: int,
  data: str,
  execution: dict | None = None,
  profile: str | None = None,
  microbatches_per_device: int = 0,
) -> dict:
  """Tokens/s of ``steps`` training steps of ``model`` under ``recipe`` on the first ``n`` devices; ``execution``:
  model_overrides of how the step runs (``train.execution_overrides``). With ``profile`` (a folder), the same steps
  run once more under the JAX profiler, untimed, and the result gains ``profile``: the trace's
  ``step_profile.summarize``. ``microbatches_per_device`` L > 0: ``--deterministic n·L`` (data / fsdp), or
  ``--deterministic L --tensor-shards n`` (model)."""
  execution = {"quantizer_backend": "auto", **(execution or {})}
  batch = per_device_batch * (n if kind != "model" else 1)
  config = train.TrainConfig(
    model=model,
    recipe=recipe,
    data=data,
    batch_size=batch,
    seq_len=seq_len,
    tokens=batch * seq_len * (steps + warmup),
    log_every=1,
    ckpt_every=1,
    deterministic=microbatches_per_device * (n if kind != "model" else 1),
    tensor_shards=n if kind == "model" and microbatches_per_device else 1,
  )
  trainer = train.Trainer(config, layout=layout_for(kind, n), model_overrides=execution)
  state = trainer.init_state()
  inputs = [(trainer.place(trainer.stream.batch(s)), trainer.quant_key(s)) for s in range(steps + warmup)]
  start = time.perf_counter()
  step = trainer.train_step.lower(state, *inputs[0]).compile()
  compile_s = time.perf_counter() - start

  def run(state, batches):
    metrics = None
    for tokens, key in batches:
      state, metrics = step(state, tokens, key)
    return jax.block_until_ready((state, metrics))

  state, _ = run(state, inputs[:warmup])
  start = time.perf_counter()
  state, metrics = run(state, inputs[warmup:])
  seconds = time.perf_counter() - start
  summary = {}
  if profile:
    with jax.profiler.trace(profile, create_perfetto_trace=True):
      run(state, inputs[warmup:])
    summary = {"profile": step_profile.summarize(step_profile.find_trace(profile), steps)}
  return {
    "recipe": recipe,
    "model": model,
    "devices": n,
    "mesh": kind,
    "deterministic": config.deterministic,
    "tensor_shards": config.tensor_shards,
    **execution,
    "global_batch": batch,
    "seq_len": seq_len,
    "compile_s": compile_s,
    "step_time_s": seconds / steps,
    "tokens_per_s": batch * seq_len * steps / seconds,
    "loss": float(metrics["loss"]),
    "device_kind": jax.devices()[0].device_kind,
    **summary,
  }


def efficiencies(results: list[dict]) -> list[dict]:
  """Adds ``scaling_efficiency`` = tokens/s(n) / (n · tokens/s(1)) per recipe and mesh kind (data / fsdp), or
  the speed-up over one device divided by n (model)."""
  base = {(r["recipe"], r["mesh"]): r for r in results if r["devices"] == 1}
  for r in results:
    one = base.get((r["recipe"], r["mesh"]))
    r["scaling_efficiency"] = None if one is None else r["tokens_per_s"] / (r["devices"] * one["tokens_per_s"])
  return results


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="fp4jax-bench-scaling", description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="125M")
  parser.add_argument("--recipes", default="bf16,nvidia_nvfp4,quartet2")
  parser.add_argument("--devices", default="1,2,4", help="comma-separated device counts")
  parser.add_argument("--mesh", default="data", choices=MESH_KINDS)
  parser.add_argument("--per-device-batch", type=int, default=8)
  parser.add_argument("--seq-len", type=int, default=1024)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--data", default="stdlib")
  train.add_execution_arguments(parser)
  parser.add_argument(
    "--profile", default=None, help="folder: trace the timed steps once more with the JAX profiler and summarize them"
  )
  parser.add_argument("--out", default=None, help="write the results (JSON list) here")
  parser.add_argument("--matmul-size", type=int, default=8192, help="bf16 GEMM of this size³ sets the MFU divisor")
  parser.add_argument("--smoke", action="store_true", help="CPU check: 100K model, devices 1,2, 3 steps, bf16 + nvfp4")
  parser.add_argument(
    "--microbatches-per-device",
    type=int,
    default=0,
    metavar="L",
    help="train with --deterministic n·L on n devices (data / fsdp meshes), or --deterministic "
    "L --tensor-shards n (model); sets its XLA flags",
  )
  args = parser.parse_args(argv)
  if args.smoke:  # two host devices, unless XLA_FLAGS says otherwise: XLA reads it when the first device is asked for
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
  if args.microbatches_per_device:
    deterministic.set_gpu_flags()
  if args.smoke:
    args.model, args.recipes, args.devices = "100K", "bf16,nvidia_nvfp4", "1,2"
    args.per_device_batch, args.seq_len, args.steps, args.warmup, args.matmul_size = 2, 64, 3, 1, 256
  counts = [int(n) for n in args.devices.split(",")]
  if max(counts) > len(jax.devices()):
    parser.error(f"--devices {args.devices}: only {len(jax.devices())} devices are visible")
  rate = matmul_tflops(args.matmul_size)
  per_token = flops_per_token(args.model, args.seq_len)
  print(f"bf16 {args.matmul_size}^3 GEMM: {rate:.1f} TFLOP/s; {per_token / 1e6:.0f} MFLOP per token", flush=True)
  results = []
  for recipe in args.recipes.split(","):
    for n in counts:
      r = measure(
        recipe,
        args.model,
        n,
        args.mesh,
        args.per_device_batch,
        args.seq_len,
        args.steps,
        args.warmup,
        args.data,
        train.execution_overrides(args),
        args.profile and f"{args.profile}/{recipe}-{n}",
        args.microbatches_per_device,
      )
      r.update(matmul_tflops=rate, flops_per_token=per_token, mfu=r["tokens_per_s"] * per_token / (n * rate * 1e12))
      results.append(r)
      print(json.dumps(r), flush=True)
  efficiencies(results)
  print(f"{'recipe':14s} {'devices':>7s} {'tokens/s':>12s} {'efficiency':>10s} {'MFU':>6s} {'compile s':>9s}")
  for r in results:
    eff = "" if r["scaling_efficiency"] is None else f"{r['scaling_efficiency']:.1%}"
    print(
      f"{r['recipe']:14s} {r['devices']:7d} {r['tokens_per_s']:12,.0f} {eff:>10s} {r['mfu']:6.1%} {r['compile_s']:9.1f}"
    )
  if args.out:
    with open(args.out, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
