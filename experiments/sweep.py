"""Grids of training runs: model sizes × tokens-per-parameter ratios × recipes, resumable, in time-boxed pieces.

  fp4jax-sweep --out runs/sweep --sizes 30M 50M 100M --ratios 100 \\
      --recipes bf16 nvfp4_rtn nvidia_nvfp4 quartet quartet2 ms_fp4 --data linux --max-minutes 9 --devices 0,1,2,3

Run ``{size}-r{ratio}-{recipe}`` trains D = ratio · N tokens (N = non-embedding parameters, the Quartet convention;
D rounded down to whole steps) in ``OUT/{name}``; ``--seeds 0 1 2`` trains each cell once per seed, as
``{size}-r{ratio}-{recipe}-s{seed}``. Each invocation skips finished runs (``summary.json``), resumes
unfinished ones from their checkpoints, and stops launching when ``--max-minutes`` is nearly spent; each launched
run gets the remaining time as its own ``--max-minutes`` and pauses cleanly, so a piece ends before the budget.
``--devices 0,1`` runs one training process per GPU at once (``CUDA_VISIBLE_DEVICES``); ``--gpus-per-run 2`` gives
each run a group of two of them, data parallel (``--mesh data=2``; the quantized operands are the one-device ones,
see ``fp4jax.sharding``); ``--runs-per-device 2`` runs two processes per GPU (each with that share of the GPU's
memory). That pays only for models too small to keep a GPU busy (they leave it idle during compilation and between
kernel launches); a run that keeps it busy gets a share of its time, so two finish no sooner than one after the
other (BENCHMARKS.md's sweep-shape sections: 10M and 30M on an H200). Without ``--devices``, runs go one after
another on the default device; with it, the runs beyond one per slot wait for a free slot. Runs start in decreasing
order of training compute (N·D), so the longest are not left for last. ``--results FILE`` writes one JSON line per
finished run (its summary and validation curve), the input of ``fp4jax-scaling-law``; it is rewritten each time a
run's process ends, so a piece stopped from outside keeps the runs that finished (``--eval-results`` likewise).
``--final-eval-batches 32 --eval-results FILE`` has each run evaluate 32 validation batches as it finishes, while
its weights are on the device, and writes those per-batch losses (``fp4jax-evaluate``'s records, for its gap table)
to FILE. Runs share JAX's persistent compilation cache in ``OUT/.jax-cache`` (unless ``JAX_COMPILATION_CACHE_DIR``
is set), so a resumed piece does not compile again.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fp4jax_experiments import cli, train
from fp4jax_experiments import model as model_lib

STARTUP_MINUTES = 1.0  # a run is launched only with at least this much budget left (imports, data, compile)
POLL_SECONDS = 1.0
COMPILE_CACHE = ".jax-cache"  # in the sweep folder; a dot name, so `evaluate OUT/*` does not take it for a run


@dataclasses.dataclass(frozen=True)
class Run:
  name: str
  config: train.TrainConfig


def plan(
  base: train.TrainConfig,
  sizes: Sequence[str],
  ratios: Sequence[float],
  recipes: Sequence[str],
  seeds: Sequence[int] | None = None,
) -> list[Run]:
  """Every (size, ratio, recipe) as a :class:`Run`, tokens = ratio · N rounded down to whole steps; with ``seeds``,
  each of them once per seed (``TrainConfig.seed``: initialization, data order and quantization keys), named
  ``{size}-r{ratio}-{recipe}-s{seed}``; without, ``base.seed`` and no suffix. Under ``base.causal_amax`` the recipe
  in the name is ``train.recipe_label``'s (``<recipe>:causal``).

  Raises:
    ValueError: a ratio is not positive, ``seeds`` is empty or repeats a seed, or a recipe is unknown
      (``model.resolve_recipe``: before any run starts, not in each run's process).
  """
  if seeds is not None and (not seeds or len(set(seeds)) != len(seeds)):
    raise ValueError(f"seeds: expected distinct seeds, got {list(seeds)}")
  for recipe in recipes:
    model_lib.resolve_recipe(recipe)
  runs = []
  for size in sizes:
    n = model_lib.parameter_count(model_lib.model_config(size))["non_embedding"]
    for ratio in ratios:
      if ratio <= 0:
        raise ValueError(f"ratios: {ratio} must be positive")
      tokens = int(ratio * n) // base.tokens_per_step * base.tokens_per_step
      for recipe in recipes:
        config = dataclasses.replace(base, model=size, recipe=recipe, tokens=tokens)
        name = f"{size}-r{ratio:g}-{train.recipe_label(config)}"
        if seeds is None:
          runs.append(Run(name, config))
        else:
          runs += [Run(f"{name}-s{s}", dataclasses.replace(config, seed=s)) for s in seeds]
  return runs


def run_state(folder: Path) -> str:
  """ "finished" or "diverged" (summary.json's status), "partial" (a started run: resumes, interrupted ones
  included), or "new"."""
  if (folder / "summary.json").exists():
    status = json.loads((folder / "summary.json").read_text()).get("status", "finished")
    if status in ("finished", "diverged"):
      return status
  return "partial" if (folder / "config.json").exists() else "new"


def train_command(
  run: Run,
  folder: Path,
  minutes: float,
  cache_dir: str | None,
  mesh: str | None = None,
  execution: dict | None = None,
  final_eval_batches: int = 0,
) -> list[str]:
  """The ``fp4jax_experiments.train`` command of ``run``; ``execution``: its model_overrides (remat, scan_unroll,
  ...); ``final_eval_batches``: per-batch validation losses written when it finishes (``train.FINAL_EVAL``)."""
  command = [
    sys.executable,
    "-m",
    "fp4jax_experiments.train",
    *train.config_to_args(run.config),
    *(train.execution_to_args(execution) if execution else []),
    *(["--final-eval-batches", str(final_eval_batches)] if final_eval_batches else []),
    "--out",
    str(folder),
    "--max-minutes",
    f"{minutes:.2f}",
  ]
  return command + (["--cache-dir", cache_dir] if cache_dir else []) + (["--mesh", mesh] if mesh else [])


def device_groups(devices: Sequence[str], gpus_per_run: int) -> list[str]:
  """GPU ids in groups of ``gpus_per_run`` (each group one ``CUDA_VISIBLE_DEVICES`` value, e.g. "0,1")."""
  if gpus_per_run < 1 or len(devices) % gpus_per_run:
    raise ValueError(f"gpus_per_run={gpus_per_run} must be >= 1 and divide the {len(devices)} devices")
  return [",".join(devices[i : i + gpus_per_run]) for i in range(0, len(devices), gpus_per_run)]


def training_compute(run: Run) -> float:
  """N·D of a run (non-embedding parameters times tokens), the order in which runs are launched."""
  return model_lib.parameter_count(model_lib.model_config(run.config.model))["non_embedding"] * run.config.tokens


def slot_environment(device: str | None, runs_per_device: int, compile_cache: Path | None = None) -> dict[str, str]:
  """The environment of a training process on ``device``: its GPU, its share of the GPU's memory, and JAX's
  persistent compilation cache (``compile_cache``, unless the caller's environment names one): a resumed piece
  and a rerun reuse the compiled train step instead of compiling it again."""
  env = dict(os.environ)
  if compile_cache is not None:
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(compile_cache))
  if device is None:
    return env
  env["CUDA_VISIBLE_DEVICES"] = device
  if runs_per_device > 1:
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / runs_per_device:.2f}")
  return env


def execute(
  runs: Sequence[Run],
  out: Path,
  max_minutes: float,
  devices: Sequence[str] = (),
  cache_dir: str | None = None,
  command: Callable[[Run, Path, float, str | None], list[str]] = train_command,
  runs_per_device: int = 1,
  on_exit: Callable[[], None] | None = None,
) -> dict[str, str]:
  """Launch the unfinished runs (partial ones first, then by decreasing N·D) on free device slots until the budget
  is nearly spent. ``on_exit()`` is called each time a launched run's process ends (finished, paused or failed),
  e.g. to rewrite the results files, so that a piece stopped from outside keeps what finished before.

  Returns {run name: state after this piece}.
  """
  if runs_per_device < 1:
    raise ValueError(f"runs_per_device must be at least 1, got {runs_per_device}")
  deadline = time.monotonic() + 60 * max_minutes
  pending = sorted(
    (r for r in runs if run_state(out / r.name) not in ("finished", "diverged")),
    key=lambda r: (run_state(out / r.name) != "partial", -training_compute(r)),
  )
  slots = [(d, i) for i in range(runs_per_device) for d in (list(devices) or [None])]  # each GPU once first
  running: dict[tuple[str | None, int], tuple[Run, subprocess.Popen]] = {}
  while pending or running:
    for slot, (run, proc) in list(running.items()):
      if proc.poll() is not None:
        del running[slot]
        if proc.returncode:
          print(f"{run.name}: exit status {proc.returncode}, see {out / run.name / 'train.log'}", file=sys.stderr)
        if on_exit is not None:
          on_exit()
    minutes_left = (deadline - time.monotonic()) / 60
    if minutes_left < STARTUP_MINUTES:
      pending = []
    for slot in [s for s in slots if s not in running]:
      if not pending:
        break
      run = pending.pop(0)
      folder = out / run.name
      folder.mkdir(parents=True, exist_ok=True)
      device = slot[0]
      with open(folder / "train.log", "a") as log:
        proc = subprocess.Popen(
          command(run, folder, minutes_left - 0.5, cache_dir),
          env=slot_environment(device, runs_per_device, out / COMPILE_CACHE),
          stdout=log,
          stderr=subprocess.STDOUT,
        )
      running[slot] = (run, proc)
      print(
        f"started {run.name} on {'device ' + device if device else 'the default device'} ({minutes_left:.1f} min left)",
        file=sys.stderr,
      )
    time.sleep(POLL_SECONDS if running else 0)
  return {run.name: run_state(out / run.name) for run in runs}


def collect(out: Path, runs: Sequence[Run]) -> list[dict]:
  """Summary and validation curve [[tokens, val_loss], ...] of every finished run."""
  results = []
  for run in runs:
    folder = out / run.name
    if run_state(folder) == "finished":
      summary = json.loads((folder / "summary.json").read_text())
      curve = [[r["tokens"], r["val_loss"]] for r in train.read_metrics(folder, "val")]
      results.append({"name": run.name, **summary, "val_curve": curve})
  return results


def collect_evaluations(out: Path, runs: Sequence[Run]) -> list[dict]:
  """The ``train.FINAL_EVAL`` records (per-batch validation losses) of the runs that wrote one."""
  paths = [out / run.name / train.FINAL_EVAL for run in runs]
  return [json.loads(path.read_text()) for path in paths if path.exists()]


def build_parser() -> argparse.ArgumentParser:
  """fp4jax-sweep's command line: the training flags and the grid's (``--sizes``, ``--ratios`` and ``--recipes`` set
  each run's model, tokens and recipe)."""
  parser = cli.parser("fp4jax-sweep", __doc__.split("\n\n")[0])
  train.add_config_arguments(parser)
  train.add_execution_arguments(parser)
  parser.add_argument("--out", type=Path, required=True, help="sweep folder; one subfolder per run")
  parser.add_argument("--sizes", nargs="+", required=True, choices=list(model_lib.SIZES), help="model sizes")
  parser.add_argument("--ratios", nargs="+", type=float, required=True, help="tokens per parameter, e.g. 25 100")
  parser.add_argument("--recipes", nargs="+", required=True, help="recipes, e.g. bf16 nvidia_nvfp4 quartet2")
  parser.add_argument(
    "--seeds",
    nargs="+",
    type=int,
    default=None,
    help="train every cell once per seed (runs named ...-s{seed}); default: --seed only, no suffix",
  )
  parser.add_argument("--max-minutes", type=float, default=9.0, help="minutes of this piece; rerun to continue")
  parser.add_argument(
    "--devices",
    default="",
    help="comma-separated GPU ids, one run per GPU at once (default: none, runs one after another)",
  )
  parser.add_argument(
    "--runs-per-device",
    type=int,
    default=1,
    help="training processes per GPU at once (more than one pays only for models too small to keep a GPU busy)",
  )
  parser.add_argument(
    "--gpus-per-run",
    type=int,
    default=1,
    help="data-parallel runs over groups of this many of --devices (--mesh data=N)",
  )
  parser.add_argument("--cache-dir", default=None, help="corpus cache (default $FP4JAX_CACHE or ~/.cache/fp4jax)")
  parser.add_argument("--results", type=Path, default=None, help="write finished runs' summaries here (JSONL)")
  parser.add_argument(
    "--final-eval-batches",
    type=int,
    default=0,
    help="each run evaluates this many validation batches as it finishes (fp4jax-evaluate)",
  )
  parser.add_argument(
    "--eval-results",
    type=Path,
    default=None,
    help="write those per-batch losses here (JSONL; `fp4jax-evaluate --table` reads it)",
  )
  return parser


def main(argv: list[str] | None = None) -> None:
  parser = build_parser()
  args = parser.parse_args(argv)
  try:
    base = train.config_from_args(args)
    runs = plan(base, args.sizes, args.ratios, args.recipes, args.seeds)
  except ValueError as err:
    parser.error(str(err))
  devices = [d.strip() for d in args.devices.split(",") if d.strip()]
  if args.final_eval_batches < 0:
    parser.error(f"--final-eval-batches must be >= 0, got {args.final_eval_batches}")
  command = functools.partial(
    train_command, execution=train.execution_overrides(args), final_eval_batches=args.final_eval_batches
  )
  if args.gpus_per_run > 1:
    try:
      devices = device_groups(devices, args.gpus_per_run)
    except ValueError as err:
      parser.error(str(err))
    command = functools.partial(command, mesh=f"data={args.gpus_per_run}")
  write = functools.partial(write_results, args.out, runs, args.results, args.eval_results)
  states = execute(
    runs,
    args.out,
    args.max_minutes,
    devices,
    args.cache_dir,
    command=command,
    runs_per_device=args.runs_per_device,
    on_exit=write,
  )
  counts = {state: sum(s == state for s in states.values()) for state in ("finished", "partial", "new")}
  print(
    f"sweep {args.out}: {counts['finished']}/{len(runs)} finished, {counts['partial']} partial, "
    f"{counts['new']} not started" + ("" if counts["finished"] == len(runs) else "; rerun to continue")
  )
  results, records = write()
  if args.results:
    print(f"wrote {results} results to {args.results}")
  if args.eval_results:
    print(f"wrote {records} evaluations to {args.eval_results}")


def write_results(out: Path, runs: Sequence[Run], results: Path | None, eval_results: Path | None) -> tuple[int, int]:
  """Rewrite ``results`` (:func:`collect`) and ``eval_results`` (:func:`collect_evaluations`), each JSONL, from the
  finished runs in ``out`` (each file only if given; ``train.write_atomic``: a reader never sees half a file).
  Returns the numbers of result and evaluation records written."""
  counts = []
  for path, records in ((results, collect), (eval_results, collect_evaluations)):
    lines = records(out, runs) if path else []
    if path:
      path.parent.mkdir(parents=True, exist_ok=True)
      train.write_atomic(path, "".join(json.dumps(r) + "\n" for r in lines))
    counts.append(len(lines))
  return counts[0], counts[1]


if __name__ == "__main__":
  main()
