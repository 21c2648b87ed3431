"""Census (any machine): how large the experiments' train step is when lowered for a GPU, in StableHLO operations
with every call inlined, and what makes it large: JAX's threefry PRNG, and the operand quantizers that run as XLA
code rather than as the Pallas kernels.

    python benchmarks/hlo_census.py --recipes quartet2,nvidia_nvfp4 \
        --variants '{"default": {}, "unrolled": {"scan_unroll": 12}}' --out benchmarks/results/hlo_census_125M.json

Each recipe's step (``fp4jax_experiments.train.Trainer``, ``--batch`` x ``--seq-len`` tokens: under the default
quantizer backend, ``"auto"``, the batch decides which activations reach the kernels' size threshold) under each
variant (ModelConfig overrides) is traced and lowered for CUDA on this machine (``lowering_platforms=("cuda",)``,
the dispatch answering as on a GPU that runs the kernels, whose calls lower to Triton custom calls; no GPU needed),
then every private function is inlined at its call sites by counting: the operations (constants aside) XLA's
passes start from. On a GPU JAX lowers each threefry call as its 20 rounds unrolled, unless
``ModelConfig.threefry_kernel`` (``jax_threefry_gpu_kernel_lowering``: one custom call each, the same bits; on by
default where an FP4 stack is unrolled). Per row: the inlined operations, the threefry calls and their share of
the operations, the threefry calls by the function that makes them, the operand quantizations traced as XLA code
(``fp4jax.operand.QUANTIZE_OP``'s XLA implementation; a loop body's count once), and the Triton kernel calls of
the lowered text. ``--out`` writes them as JSON.
"""

import argparse
import collections
import functools
import json
import pathlib
import re
import shlex
import sys

if __package__ in (None, ""):  # run as a script: the repository root makes ``benchmarks`` importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import fp4jax.backends
from benchmarks.benchtools import commit, header, provenance, write_json
from fp4jax._src import backends, operand
from fp4jax_experiments import train

REPO = pathlib.Path(__file__).resolve().parents[1]
FUNC = re.compile(r"\s*func\.func (?:public |private )?@([\w.$-]+)")
CALL = re.compile(r"(?:func\.)?call @([\w.$-]+)")
OP = re.compile(r'= "?([a-z_]+\.[a-z_0-9]+)')


def functions(text: str) -> dict[str, dict]:
  """Per function of the StableHLO module ``text``: its own operations (constants aside) and the functions it calls
  (custom calls are operations)."""
  funcs, current = {}, None
  for line in text.splitlines():
    if m := FUNC.match(line):
      current = funcs[m.group(1)] = {"ops": 0, "calls": collections.Counter()}
    elif current is not None:
      if (c := CALL.search(line)) and "custom_call" not in line:
        current["calls"][c.group(1)] += 1
      elif (o := OP.search(line)) and "constant" not in o.group(1):
        current["ops"] += 1
  return funcs


def census(text: str) -> dict:
  """``main``'s operations with every call inlined, and its threefry calls (each function named ``threefry2x32*``)
  by caller."""
  funcs = functions(text)

  @functools.cache
  def inlined(name: str) -> int:
    return funcs[name]["ops"] + sum(n * inlined(callee) for callee, n in funcs[name]["calls"].items())

  by_caller, ops = collections.Counter(), collections.Counter()

  def walk(name: str, times: int) -> None:
    for callee, n in funcs[name]["calls"].items():
      if callee.startswith("threefry2x32"):
        by_caller[re.sub(r"_\d+$", "", name)] += times * n
        ops[callee] += times * n * inlined(callee)
      else:
        walk(callee, times * n)

  walk("main", 1)
  return {"inlined_ops": inlined("main"), "threefry_calls": by_caller, "threefry_ops": sum(ops.values())}


def step_and_args(model: str, recipe: str, overrides: dict, batch: int, seq_len: int) -> tuple:
  """``(train_step, its arguments)``: the experiments' jitted step of ``recipe``'s ``model`` under ``overrides``
  (ModelConfig) at ``batch`` x ``seq_len`` tokens, on its first batch (synthetic data), ready to trace."""
  config = train.TrainConfig(
    model=model, recipe=recipe, data="stdlib", batch_size=batch, seq_len=seq_len, tokens=batch * seq_len * 4
  )
  trainer = train.Trainer(config, model_overrides=overrides)
  return trainer.train_step, (trainer.init_state(), trainer.place(trainer.stream.batch(0)), trainer.quant_key(0))


def measure(model: str, recipe: str, overrides: dict, batch: int, seq_len: int) -> dict:
  """One row of the census: ``recipe``'s ``model`` step under ``overrides``, lowered for CUDA (module docstring).

  Returns:
    ``inlined_ops``, ``threefry_calls`` (total), ``threefry_share`` (of the inlined operations),
    ``threefry_by_caller``, ``xla_quantizers`` (operand quantizations traced as XLA code) and ``triton_calls``.
  """
  xla_calls = []
  xla_impl = backends._REGISTRY[operand.QUANTIZE_OP]["xla"]

  def counted(*args, **kwargs):
    xla_calls.append(1)
    return xla_impl(*args, **kwargs)

  step, args = step_and_args(model, recipe, overrides, batch, seq_len)
  backends.register(operand.QUANTIZE_OP, "xla", counted)
  try:
    traced = step.trace(*args)
  finally:
    backends.register(operand.QUANTIZE_OP, "xla", xla_impl)
  text = traced.lower(lowering_platforms=("cuda",)).as_text()
  result = census(text)
  calls = sum(result["threefry_calls"].values())
  return {
    "inlined_ops": result["inlined_ops"],
    "threefry_calls": calls,
    "threefry_share": result["threefry_ops"] / result["inlined_ops"],
    "threefry_by_caller": dict(result["threefry_calls"].most_common()),
    "xla_quantizers": len(xla_calls),
    "triton_calls": text.count("__gpu$xla.gpu.triton("),
  }


def as_gpu() -> None:
  """The kernels' dispatch answers as on a GPU that runs them (Hopper), for the rest of the process."""
  backends.compute_capability = lambda device=None: (9, 0)
  backends.has_pallas_triton = lambda device=None: True
  backends.pallas_interpret = lambda device=None: False
  fp4jax.backends.has_pallas_triton = backends.has_pallas_triton  # the experiments' unroll policy asks here


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", default="125M")
  p.add_argument("--recipes", default="nvidia_nvfp4", help="comma-separated recipe names")
  p.add_argument("--variants", default='{"default": {}}', type=json.loads, help="JSON {label: ModelConfig overrides}")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq-len", type=int, default=1024)
  p.add_argument("--commit", default=None)
  p.add_argument("--out", default=None, help="write the rows as JSON here")
  args = p.parse_args(argv)
  for name in ("batch", "seq_len"):
    if getattr(args, name) < 1:
      p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
  if not isinstance(args.variants, dict) or not all(isinstance(v, dict) for v in args.variants.values()):
    p.error(f"--variants must map labels to JSON objects of ModelConfig overrides, got {args.variants!r}")
  as_gpu()
  rows = []
  for recipe in args.recipes.split(","):
    for label, overrides in args.variants.items():
      row = {"variant": label, "recipe": recipe, **measure(args.model, recipe, overrides, args.batch, args.seq_len)}
      rows.append(row)
      print(
        f"{label} {recipe}: {row['inlined_ops']:,} operations; threefry calls {row['threefry_calls']} "
        f"({row['threefry_share']:.0%}); XLA quantizers {row['xla_quantizers']}; Triton calls {row['triton_calls']}",
        flush=True,
      )
  if args.out:
    command = shlex.join(["python", "benchmarks/hlo_census.py", *(sys.argv[1:] if argv is None else argv)])
    doc = {
      "benchmark": "hlo_census",
      "header": header(),
      **provenance(args.commit or commit(), command),
      "settings": {"model": args.model, "batch": args.batch, "seq_len": args.seq_len, "variants": args.variants},
      "rows": rows,
    }
    write_json(args.out, doc)
  return 0


if __name__ == "__main__":
  sys.exit(main())
