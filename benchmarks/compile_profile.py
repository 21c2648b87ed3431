"""Where the compile time of the experiments' train step goes: tracing and lowering (Python) against XLA's compile,
and XLA's compile passes from a JAX profiler trace of it.

  python benchmarks/compile_profile.py --recipe nvidia_nvfp4 --variants '{"scan": {}, "unrolled": {"scan_unroll": 2}}' \
      --overrides '{"n_layers": 2}'

For each variant (ModelConfig overrides over ``--overrides``): ``fp4jax_experiments.train.Trainer`` of ``--model``
under ``--recipe`` on one device, its train step traced and lowered (seconds), then compiled under
``jax.profiler.trace``; the host-side events of that trace (XLA's passes, Triton and PTX compiles, as TraceMe
events) summed by name, the ``--top`` largest (nested events count in full, so a pass and its sub-passes both
appear). Writes the JSON to ``--out`` (default benchmarks/results/compile_profile.json) after each variant.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import pathlib
import shlex
import sys
import tempfile
import time
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root makes ``benchmarks`` importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax

from benchmarks.benchtools import commit, header, provenance, write_json
from fp4jax_experiments import step_profile, train

REPO = pathlib.Path(__file__).resolve().parents[1]


def host_events(trace: pathlib.Path, top: int) -> list[list]:
  """[[event name, total ms, count], ...] of the trace's complete events off the devices, Python frames ("$...")
  left out, the ``top`` largest."""
  with gzip.open(trace, "rt") as f:
    data = json.load(f)
  events = data["traceEvents"] if isinstance(data, dict) else data
  names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
  totals = collections.defaultdict(lambda: [0.0, 0])
  for e in events:
    host = not names.get(e.get("pid"), "").startswith("/device:")
    if e.get("ph") == "X" and e.get("dur") is not None and host and not e["name"].startswith("$"):
      totals[e["name"]][0] += e["dur"] / 1e3
      totals[e["name"]][1] += 1
  return [[name, ms, n] for name, (ms, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]]


def train_step(model: str, recipe: str, overrides: dict, seq_len: int, batch: int) -> tuple[Any, tuple]:
  """``Trainer``'s jitted train step for ``model`` under ``recipe`` (``overrides``: ModelConfig fields) on one
  device, and the arguments of its first step (state, a ``batch`` x ``seq_len`` batch of the stdlib corpus, key)."""
  config = train.TrainConfig(
    model=model, recipe=recipe, data="stdlib", batch_size=batch, seq_len=seq_len, tokens=batch * seq_len * 10
  )
  trainer = train.Trainer(config, model_overrides=overrides)
  return trainer.train_step, (trainer.init_state(), trainer.place(trainer.stream.batch(0)), trainer.quant_key(0))


def measure(model: str, recipe: str, overrides: dict, seq_len: int, batch: int, top: int) -> dict:
  """Trace, lower and compile the experiments' train step once, timing each stage and profiling the compile.

  Args:
    model: a size of ``fp4jax_experiments.model.SIZES``.
    recipe: the recipe name.
    overrides: ``ModelConfig`` fields replacing the size table's (e.g. ``{"scan_unroll": 1}``).
    seq_len: tokens per row.
    batch: rows per step.
    top: how many of XLA's compile passes (host events, by total time) to keep.

  Returns:
    ``trace_s``, ``lower_s``, ``compile_s`` (wall seconds of each stage), ``stablehlo_chars`` (the lowered
    program's length), ``optimized_hlo_lines`` and ``custom_calls`` (of the compiled HLO text) and ``host_events``
    (the compile's ``top`` profiler host events, ``[name, ms, count]``).
  """
  step, args = train_step(model, recipe, overrides, seq_len, batch)
  start = time.perf_counter()
  traced = step.trace(*args)
  traced_at = time.perf_counter()
  lowered = traced.lower()
  lowered_at = time.perf_counter()
  print(f"  traced in {traced_at - start:.1f} s, lowered in {lowered_at - traced_at:.1f} s; compiling", flush=True)
  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder, create_perfetto_trace=True):
      compiled = lowered.compile()
    compiled_at = time.perf_counter()
    events = host_events(step_profile.find_trace(folder), top)
  hlo = compiled.as_text() or ""
  return {
    "trace_s": traced_at - start,
    "lower_s": lowered_at - traced_at,
    "compile_s": compiled_at - lowered_at,
    "stablehlo_chars": len(lowered.as_text()),
    "optimized_hlo_lines": hlo.count("\n"),
    "custom_calls": hlo.count("custom-call("),
    "host_events": events,
  }


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", default="125M")
  p.add_argument("--recipe", default="nvidia_nvfp4")
  p.add_argument("--overrides", default="{}", type=json.loads, help="JSON ModelConfig overrides of every variant")
  p.add_argument("--variants", default='{"scan": {}}', type=json.loads, help="JSON {label: ModelConfig overrides}")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq-len", type=int, default=1024)
  p.add_argument("--top", type=int, default=30)
  p.add_argument("--commit", default=None)
  p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "compile_profile.json"))
  args = p.parse_args(argv)
  command = shlex.join(["python", "benchmarks/compile_profile.py", *(sys.argv[1:] if argv is None else argv)])
  rows = {}
  doc = {
    "benchmark": "compile_profile",
    "header": header(),
    **provenance(args.commit or commit(), command),
    "settings": {"model": args.model, "recipe": args.recipe, "overrides": args.overrides},
    "variants": rows,
  }
  for label, overrides in args.variants.items():
    rows[label] = measure(args.model, args.recipe, {**args.overrides, **overrides}, args.seq_len, args.batch, args.top)
    write_json(args.out, doc)  # after every variant: a later one cut off by a timeout keeps the earlier ones
    r = rows[label]
    print(
      f"{label}: trace {r['trace_s']:.1f} s, lower {r['lower_s']:.1f} s, compile {r['compile_s']:.1f} s, "
      f"{r['optimized_hlo_lines']} HLO lines, {r['custom_calls']} custom calls",
      flush=True,
    )
    for name, ms, n in r["host_events"][:12]:
      print(f"    {ms / 1e3:8.2f} s {n:6d}  {name[:100]}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
