"""Training throughput of the experiments' Llama under each recipe, side by side with the plain-JAX anchor.

  python benchmarks/train_throughput.py --devices 1 --recipes bf16,nvidia_nvfp4,quartet2     # one GPU
  python benchmarks/train_throughput.py                     # 1 and 2 GPUs, bf16,nvidia_nvfp4,quartet2,ms_fp4,quartet
  python benchmarks/train_throughput.py --smoke             # CPU: 100K model, bf16, 1 and 2 host devices, 2 steps

In one process, for each device count n of ``--devices``: the anchor (``benchmarks/anchor.py``, bf16) and
``fp4jax_experiments.train.Trainer`` under each recipe of ``--recipes`` (its own execution defaults, or
``--experiments-overrides``; ``bench_scaling``'s data-parallel mesh, its gradients all-reduced in
``--grad-comm-dtype`` on n > 1) are built and their train steps compiled (timed:
``compile_s``, lowering included), then all train ``--warmup`` untimed steps, then ``--rounds`` rounds in which each
trains ``--steps`` steps in turn (dispatched back to back, synchronized once), so that a drift of the device's speed
hits every entry alike. Global batch n · ``--batch`` rows of ``--seq-len`` tokens (weak scaling), data parallel: the
anchor's batch split over a one-axis mesh with replicated state. Batches and keys are placed on the devices before
timing.

Per entry: step time = a round's seconds / ``--steps`` (median and min over the rounds), tokens/s = global batch ·
seq_len / median step time, MFU = tokens/s · FLOPs per token / (n · R) (``bench_scaling.flops_per_token``,
6·N + 12·L·d·T, the same for both models since they share the shape; R the bf16 GEMM rate measured at the start by
``bench_scaling.matmul_tflops``), ``ratio_to_anchor`` = tokens/s / the anchor's tokens/s on the same n,
``scaling_efficiency`` = tokens/s(n) / (n · tokens/s(1)) of the same model and recipe. ``--profile DIR`` traces
``--profile-steps`` more steps of each entry with the JAX profiler and adds ``step_profile.summarize`` (top kernels
by time) to it. An entry that fails (compile or run), or whose tracing, lowering and compiling outrun
``--max-compile-s``, is recorded with its ``error``, the others go on, and the command exits non-zero after writing
the JSON. Such a compile goes on in the background: each row records whether it was compiled or timed beside one
(``beside_abandoned_compile``), which skews its numbers. The JSON is rewritten after each device count, with
``"complete": false`` until the last one.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import pathlib
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root makes ``benchmarks`` importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax

from benchmarks import anchor, benchtools
from benchmarks.benchtools import header
from fp4jax_experiments import bench_scaling, data, sharding, step_profile, train
from fp4jax_experiments import model as model_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_RECIPES = "bf16,nvidia_nvfp4,quartet2,ms_fp4,quartet"
SMOKE_RECIPES = "bf16"  # an FP4 recipe compiles for minutes on a loaded 2-core CPU; --recipes adds them
PLACED_BATCHES = 4  # distinct batches (and keys) placed on the devices, cycled through by the steps
BYTE_VOCAB = 256
DEFAULT_OUT = REPO / "benchmarks" / "results" / "train_throughput.json"
SMOKE_OUT = REPO / "runs" / "train_throughput_smoke.json"  # runs/ is git-ignored: a smoke run leaves results/ alone
ABANDONED: list[threading.Thread] = []  # compiles given up by _compile, still running


@dataclasses.dataclass
class Entry:
  """One model under one recipe on ``devices`` devices, compiled: ``advance(k)`` trains k steps, returns seconds."""

  model: str
  recipe: str
  devices: int
  global_batch: int
  flops_per_token: float
  compile_s: float
  step: Callable  # (state, *inputs) -> (state, loss)
  state: Any
  inputs: list[tuple]
  step_seconds: list[float] = dataclasses.field(default_factory=list)
  done: int = 0
  loss: float = float("nan")
  profile: dict | None = None
  beside_abandoned_compile: bool = False  # an abandoned compile ran in the background while it compiled or ran
  grad_comm_dtype: str = "float32"  # the data-parallel gradient all-reduce's dtype
  quantizer_backend: str | None = None  # the projections' quantizers as trained (experiments models; None: anchor)

  def advance(self, k: int) -> float:
    self.beside_abandoned_compile |= abandoned_compile_running()
    start = time.perf_counter()
    loss = None
    for _ in range(k):
      self.state, loss = self.step(self.state, *self.inputs[self.done % len(self.inputs)])
      self.done += 1
    jax.block_until_ready((self.state, loss))
    seconds = time.perf_counter() - start
    self.loss = float(loss)
    self.beside_abandoned_compile |= abandoned_compile_running()
    return seconds


def abandoned_compile_running() -> bool:
  """Whether a compile given up by ``_compile`` still runs in its thread (it takes CPU from what is timed)."""
  return any(worker.is_alive() for worker in ABANDONED)


class CompileTimeout(Exception):
  """A train step's tracing, lowering and compiling outran ``--max-compile-s``: recorded as the entry's error, the
  others go on."""


def _compile(step, state, inputs, max_seconds: float) -> tuple[Callable, float]:
  """``step`` traced, lowered and compiled for the first inputs, and the seconds all three took; CompileTimeout
  when they outrun ``max_seconds`` (tracing and lowering run to the end first; XLA's compile goes on in a daemon
  thread, abandoned: ``main`` ends the process with os._exit)."""
  start = time.perf_counter()
  lowered = step.lower(state, *inputs[0])
  lowered_at = time.perf_counter()
  result = {}

  def work():
    try:
      result["compiled"] = lowered.compile()
    except Exception as error:  # noqa: BLE001 (raised again below, in the caller's thread)
      result["error"] = error

  worker = threading.Thread(target=work, daemon=True)
  worker.start()
  worker.join(None if math.isinf(max_seconds) else max(max_seconds - (lowered_at - start), 0.0))
  if worker.is_alive():
    ABANDONED.append(worker)
    raise CompileTimeout(
      f"tracing, lowering and compiling the train step took more than --max-compile-s {max_seconds:g} s "
      "(the compile is abandoned, still running in the background)"
    )
  if "error" in result:
    raise result["error"]
  compiled = result["compiled"]
  seconds = time.perf_counter() - start
  print(f"  traced and lowered in {lowered_at - start:.1f} s, XLA compile {seconds - (lowered_at - start):.1f} s")
  return compiled, seconds


def anchor_entry(
  size: str,
  n: int,
  per_device_batch: int,
  seq_len: int,
  total_steps: int,
  spec: str,
  attention: anchor.Attention,
  max_compile_s: float = float("inf"),
) -> Entry:
  """The anchor of ``size`` on the first ``n`` devices (data parallel), on ``spec``'s batches."""
  corpus = data.load_corpus(spec)
  if corpus.vocab_size != BYTE_VOCAB:
    raise ValueError(
      f"--data {spec!r} has a vocabulary of {corpus.vocab_size}; the benchmark's models and FLOPs "
      f"count a byte vocabulary of {BYTE_VOCAB}"
    )
  config = anchor.anchor_config(size, attention=attention)
  trainer = anchor.Trainer(config, anchor.make_optimizer(model_lib.SIZES[size].lr, total_steps), anchor.data_mesh(n))
  stream = data.BatchStream(corpus.train, per_device_batch * n, seq_len, seed=0)
  state = trainer.init_state(jax.random.key(0))
  inputs = [(trainer.place(stream.batch(s)),) for s in range(PLACED_BATCHES)]
  compiled, seconds = _compile(trainer.jitted_step(), state, inputs, max_compile_s)
  return Entry(
    "anchor",
    model_lib.BF16_RECIPE,
    n,
    per_device_batch * n,
    anchor.flops_per_token(config, seq_len),
    seconds,
    compiled,
    state,
    inputs,
  )


def experiments_entry(
  label: str,
  recipe: str,
  size: str,
  n: int,
  per_device_batch: int,
  seq_len: int,
  total_steps: int,
  spec: str,
  overrides: dict,
  max_compile_s: float = float("inf"),
  grad_comm_dtype: str = "float32",
) -> Entry:
  """``fp4jax_experiments.train.Trainer`` of ``size`` under ``recipe`` on ``bench_scaling``'s data mesh of n, with
  the ModelConfig ``overrides``, its data-parallel gradients all-reduced in ``grad_comm_dtype`` when n > 1 (one
  device communicates none: float32 there); recorded as model ``label``."""
  batch = per_device_batch * n
  config = train.TrainConfig(
    model=size,
    recipe=recipe,
    data=spec,
    batch_size=batch,
    seq_len=seq_len,
    tokens=batch * seq_len * total_steps,
    log_every=1,
    ckpt_every=1,
    grad_comm_dtype=grad_comm_dtype if n > 1 else "float32",
  )
  trainer = train.Trainer(config, layout=bench_scaling.layout_for("data", n), model_overrides=overrides)
  if trainer.corpus.vocab_size != BYTE_VOCAB:
    raise ValueError(
      f"--data {spec!r} has a vocabulary of {trainer.corpus.vocab_size}; the benchmark's FLOPs "
      f"count a byte vocabulary of {BYTE_VOCAB}"
    )
  state = trainer.init_state()
  inputs = [(trainer.place(trainer.stream.batch(s)), trainer.quant_key(s)) for s in range(PLACED_BATCHES)]
  compiled, seconds = _compile(trainer.train_step, state, inputs, max_compile_s)

  def step(state, tokens, key):
    state, metrics = compiled(state, tokens, key)
    return state, metrics["loss"]

  return Entry(
    label,
    recipe,
    n,
    batch,
    bench_scaling.flops_per_token(size, seq_len),
    seconds,
    step,
    state,
    inputs,
    grad_comm_dtype=config.grad_comm_dtype,
    quantizer_backend=trainer.model_config.quantizer_backend,
  )


def _record(entry: Entry, seq_len: int, rate_tflops: float) -> dict:
  median = statistics.median(entry.step_seconds)
  tokens_per_s = entry.global_batch * seq_len / median
  return {
    "model": entry.model,
    "recipe": entry.recipe,
    "devices": entry.devices,
    "global_batch": entry.global_batch,
    "seq_len": seq_len,
    "tokens_per_s": tokens_per_s,
    "step_time_median_s": median,
    "step_time_min_s": min(entry.step_seconds),
    "step_time_rounds_s": entry.step_seconds,
    "mfu": tokens_per_s * entry.flops_per_token / (entry.devices * rate_tflops * 1e12),
    "compile_s": entry.compile_s,
    "flops_per_token": entry.flops_per_token,
    "loss": entry.loss,
    "beside_abandoned_compile": entry.beside_abandoned_compile,
    "grad_comm_dtype": entry.grad_comm_dtype,
    "quantizer_backend": entry.quantizer_backend,
    **({"profile": entry.profile} if entry.profile is not None else {}),
  }


def _failure(model: str, recipe: str, n: int, error: BaseException) -> dict:
  traceback.print_exception(error)
  return {"model": model, "recipe": recipe, "devices": n, "error": f"{type(error).__name__}: {error}"}


def add_ratios(rows: list[dict]) -> list[dict]:
  """Adds ``ratio_to_anchor`` (tokens/s over the anchor's on the same device count) and ``scaling_efficiency``
  (tokens/s(n) / (n · tokens/s(1)) of the same model and recipe); None where the reference is missing."""
  ok = [r for r in rows if "error" not in r]
  anchors = {r["devices"]: r for r in ok if r["model"] == "anchor"}
  ones = {(r["model"], r["recipe"]): r for r in ok if r["devices"] == 1}
  for r in ok:
    base, one = anchors.get(r["devices"]), ones.get((r["model"], r["recipe"]))
    r["ratio_to_anchor"] = None if base is None else r["tokens_per_s"] / base["tokens_per_s"]
    r["scaling_efficiency"] = None if one is None else r["tokens_per_s"] / (r["devices"] * one["tokens_per_s"])
  return rows


def run_device_count(n: int, args: argparse.Namespace, variants: dict[str, dict], rate: float) -> list[dict]:
  """Every entry on n devices: built and compiled, warmed up, timed in interleaved rounds, optionally profiled."""
  total = args.warmup + args.rounds * args.steps + (args.profile_steps if args.profile else 0)
  max_compile = float("inf") if args.max_compile_s is None else args.max_compile_s
  builders = [
    (
      "anchor",
      model_lib.BF16_RECIPE,
      lambda: anchor_entry(
        args.model, n, args.batch, args.seq_len, total, args.data, args.anchor_attention, max_compile
      ),
    )
  ]
  builders += [
    (
      label,
      recipe,
      lambda label=label, recipe=recipe, overrides=overrides: experiments_entry(
        label,
        recipe,
        args.model,
        n,
        args.batch,
        args.seq_len,
        total,
        args.data,
        overrides,
        max_compile,
        args.grad_comm_dtype,
      ),
    )
    for recipe in args.recipes
    for label, overrides in variants.items()
  ]
  entries, failed = [], []
  for model, recipe, build in builders:
    try:
      beside = abandoned_compile_running()
      entries.append(build())
      entries[-1].beside_abandoned_compile |= beside or abandoned_compile_running()
      print(f"{model} {recipe} on {n}: compiled in {entries[-1].compile_s:.1f} s", flush=True)
    except Exception as error:  # noqa: BLE001 (recorded in the JSON; the command exits non-zero)
      failed.append(_failure(model, recipe, n, error))

  def each(action: Callable[[Entry], None]) -> None:
    for entry in list(entries):
      try:
        action(entry)
      except Exception as error:  # noqa: BLE001
        failed.append(_failure(entry.model, entry.recipe, n, error))
        entries.remove(entry)

  each(lambda e: e.advance(args.warmup))
  for _ in range(args.rounds):
    each(lambda e: e.step_seconds.append(e.advance(args.steps) / args.steps))
  if args.profile:
    each(lambda e: setattr(e, "profile", profile(e, f"{args.profile}/{e.model}-{e.recipe}-{n}", args.profile_steps)))
  return [_record(e, args.seq_len, rate) for e in entries] + failed


def profile(entry: Entry, folder: str, steps: int) -> dict:
  """``step_profile.summarize`` of a JAX profiler trace of ``steps`` more steps of ``entry``."""
  with jax.profiler.trace(folder, create_perfetto_trace=True):
    entry.advance(steps)
  return step_profile.summarize(step_profile.find_trace(folder), steps, top=30)


def _table(rows: list[dict]) -> str:
  lines = [
    (
      f"{'model':12s} {'recipe':13s} {'dev':>3s} {'tokens/s':>11s} {'ms/step':>8s} {'MFU':>6s} "
      f"{'/anchor':>7s} {'weak eff':>8s} {'compile s':>9s}"
    )
  ]
  for r in rows:
    if "error" in r:
      lines.append(f"{r['model']:12s} {r['recipe']:13s} {r['devices']:3d} failed: {r['error'][:80]}")
      continue
    fmt = lambda x, spec: "" if x is None else format(x, spec)
    lines.append(
      f"{r['model']:12s} {r['recipe']:13s} {r['devices']:3d} {r['tokens_per_s']:11,.0f} "
      f"{r['step_time_median_s'] * 1e3:8.2f} {r['mfu']:6.1%} {fmt(r['ratio_to_anchor'], '7.3f'):>7s} "
      f"{fmt(r['scaling_efficiency'], '.1%'):>8s} {r['compile_s']:9.1f}"
    )
  return "\n".join(lines)


def _positive_seconds(text: str) -> float:
  """``--max-compile-s``'s value: a finite number of seconds > 0."""
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not (math.isfinite(value) and value > 0):
    raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
  return value


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", default="125M", choices=list(model_lib.SIZES))
  p.add_argument(
    "--recipes", default=None, help=f"comma-separated (default {DEFAULT_RECIPES}; --smoke: {SMOKE_RECIPES})"
  )
  p.add_argument("--devices", default="1,2", help="comma-separated device counts")
  p.add_argument("--batch", type=int, default=16, help="rows per device (global batch = devices x this)")
  p.add_argument("--seq-len", type=int, default=1024)
  p.add_argument("--warmup", type=int, default=3, help="untimed steps per entry after its compile")
  p.add_argument("--steps", type=int, default=10, help="timed steps per entry per round")
  p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
  p.add_argument("--data", default="stdlib", help="a byte corpus (fp4jax_experiments.data.load_corpus)")
  p.add_argument(
    "--anchor-attention",
    default=None,
    choices=["cudnn", "xla"],
    help="the anchor's jax.nn.dot_product_attention implementation (default: cudnn on a GPU)",
  )
  p.add_argument(
    "--experiments-overrides",
    default="{}",
    type=json.loads,
    help='JSON ModelConfig overrides of the experiments model, e.g. \'{"quantizer_backend": "auto"}\'',
  )
  p.add_argument(
    "--experiments-variants",
    default=None,
    type=json.loads,
    help="JSON object {label: ModelConfig overrides}: several experiments models side by side, each recorded under "
    'its label (e.g. \'{"experiments": {}, "scan": {"scan_unroll": 1}}\'); replaces --experiments-overrides.',
  )
  p.add_argument(
    "--grad-comm-dtype",
    default="float32",
    choices=list(sharding.GRAD_COMM_DTYPES),
    help="the experiments models' data-parallel gradient all-reduce on n > 1 devices (an FP4 model trains under "
    "shard_map with each device's kernels on its token shard, whatever the dtype; a bf16 model under XLA's "
    "partitioner for float32)",
  )
  p.add_argument("--matmul-size", type=int, default=8192, help="bf16 GEMM of this size³ sets the MFU divisor")
  p.add_argument(
    "--max-compile-s",
    type=_positive_seconds,
    default=None,
    help="give up an entry whose train step takes longer to trace, lower and compile (recorded as its error; "
    "default: no limit)",
  )
  p.add_argument("--profile", default=None, help="folder: trace each entry's --profile-steps more steps")
  p.add_argument("--profile-steps", type=int, default=3)
  p.add_argument("--commit", default=None, help="this tree's commit (default: git rev-parse)")
  p.add_argument(
    "--out",
    default=None,
    help=f"the JSON document (default {DEFAULT_OUT.relative_to(REPO)}; --smoke: {SMOKE_OUT.relative_to(REPO)})",
  )
  p.add_argument("--smoke", action="store_true", help="CPU check: 100K model, devices 1,2, batch 2 x 64, 2 steps")
  return p


def _smoke_setup(args: argparse.Namespace) -> None:
  """CPU, two host devices (XLA reads XLA_FLAGS when the first device is asked for), a 100K model, 2 steps."""
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=2".strip()
  jax.config.update("jax_platforms", "cpu")
  args.model, args.devices, args.batch, args.seq_len = "100K", "1,2", 2, 64
  args.warmup, args.steps, args.rounds, args.matmul_size, args.profile_steps = 1, 2, 1, 256, 1


def command_line(argv: list[str], xla_flags: str = "") -> str:
  """The shell command that reruns this benchmark with ``argv`` (``benchtools.command_line``)."""
  return benchtools.command_line("benchmarks/train_throughput.py", argv, xla_flags)


def main(argv: list[str] | None = None) -> None:
  parser = _parser()
  args = parser.parse_args(argv)
  xla_flags = os.environ.get("XLA_FLAGS", "")  # the caller's (the smoke run adds its own host devices)
  if args.smoke:
    _smoke_setup(args)
  args.recipes = (args.recipes or (SMOKE_RECIPES if args.smoke else DEFAULT_RECIPES)).split(",")
  for name in ("batch", "seq_len", "steps", "rounds", "profile_steps"):
    if getattr(args, name) < 1:
      parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
  if args.warmup < 0:
    parser.error(f"--warmup must be >= 0, got {args.warmup}")
  if not isinstance(args.experiments_overrides, dict):
    parser.error(f"--experiments-overrides must be a JSON object, got {args.experiments_overrides!r}")
  variants = args.experiments_variants or {"experiments": args.experiments_overrides}
  if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()) or "anchor" in variants:
    parser.error(f"--experiments-variants must map labels other than 'anchor' to JSON objects, got {variants!r}")
  counts = [int(n) for n in args.devices.split(",")]
  if min(counts) < 1 or max(counts) > len(jax.devices()):
    parser.error(f"--devices {args.devices}: {len(jax.devices())} devices are visible")
  args.anchor_attention = args.anchor_attention or anchor.default_attention()
  rate = bench_scaling.matmul_tflops(args.matmul_size)
  print(f"bf16 {args.matmul_size}^3 GEMM: {rate:.1f} TFLOP/s", flush=True)
  dev, rows = jax.devices()[0], []
  doc = {
    "benchmark": "train_throughput",
    "header": header(),
    "device_kind": dev.device_kind,
    "platform": dev.platform,
    "jax_version": jax.__version__,
    "commit": args.commit or benchtools.commit(),
    "date": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
    "command": command_line(argv if argv is not None else sys.argv[1:], xla_flags),
    "xla_flags": xla_flags,
    "matmul_size": args.matmul_size,
    "matmul_tflops": rate,
    "settings": {
      "model": args.model,
      "per_device_batch": args.batch,
      "seq_len": args.seq_len,
      "warmup": args.warmup,
      "steps": args.steps,
      "rounds": args.rounds,
      "data": args.data,
      "anchor_attention": args.anchor_attention,
      "experiments_variants": variants,
      "max_compile_s": args.max_compile_s,
      "grad_comm_dtype": args.grad_comm_dtype,
    },
    "rows": rows,
  }
  out = pathlib.Path(args.out or (SMOKE_OUT if args.smoke else DEFAULT_OUT))
  for i, n in enumerate(counts):
    rows += run_device_count(n, args, variants, rate)
    add_ratios(rows)
    # written after every device count (a run cut short keeps what it measured), marked until the last
    benchtools.write_json(out, {**doc, "complete": i == len(counts) - 1})
  print(_table(rows))
  failed = [r for r in rows if "error" in r]
  if failed:
    print(
      f"{len(failed)} entries failed: " + "; ".join(f"{r['model']} {r['recipe']} on {r['devices']}" for r in failed),
      file=sys.stderr,
      flush=True,
    )
  if ABANDONED:  # a compile given up still runs in its thread: leave without waiting for it
    sys.stdout.flush()
    os._exit(1)
  if failed:
    raise SystemExit(1)


if __name__ == "__main__":
  main()
