"""Census (any machine): how many StableHLO operations the experiments' train step has when lowered for a GPU, and how
many of them are JAX's threefry PRNG.

    python tools/hlo_census.py [--model 125M] [--recipe nvidia_nvfp4] [--scan-unroll auto] [--threefry-kernel auto]
        [--quantizer-backend auto] [--batch 16] [--seq-len 1024]

The step (``fp4jax_experiments.train.Trainer``, ``--batch`` x ``--seq-len`` tokens: under ``--quantizer-backend
auto`` the batch decides which activations reach the kernels' size threshold) is traced and lowered for CUDA on
this machine (``lowering_platforms=("cuda",)``, the Pallas kernels as their Triton custom calls, as on a GPU that
runs them; no GPU needed), then every private function is inlined at its call sites
by counting: the operations (constants aside) XLA's passes start from. On a GPU JAX lowers each threefry call as its
20 rounds unrolled, unless ``--threefry-kernel on`` (``ModelConfig.threefry_kernel``:
``jax_threefry_gpu_kernel_lowering``, one custom call each, the same bits; ``auto``, the default, where an FP4
stack is unrolled). Prints the inlined count, the threefry calls and their share, and the threefry calls by the
function that makes them (the callers' names, as lowered).
"""

import argparse
import collections
import functools
import re

import fp4jax.backends
from fp4jax._src import backends
from fp4jax_experiments import train

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


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", default="125M")
  p.add_argument("--recipe", default="nvidia_nvfp4")
  p.add_argument("--scan-unroll", type=train.parse_scan_unroll, default="auto")
  p.add_argument("--threefry-kernel", default="auto", choices=list(train.THREEFRY_KERNEL))
  p.add_argument("--quantizer-backend", default="auto", choices=["auto", "xla", "pallas"])
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq-len", type=int, default=1024)
  args = p.parse_args()
  # a GPU that runs the Pallas kernels, as far as the dispatch asks
  backends.compute_capability = lambda device=None: (9, 0)
  backends.has_pallas_triton = lambda device=None: True
  backends.pallas_interpret = lambda device=None: False
  fp4jax.backends.has_pallas_triton = backends.has_pallas_triton  # the experiments' unroll policy asks here
  config = train.TrainConfig(
    model=args.model,
    recipe=args.recipe,
    data="stdlib",
    batch_size=args.batch,
    seq_len=args.seq_len,
    tokens=args.batch * args.seq_len * 4,
  )
  overrides = {
    "scan_unroll": args.scan_unroll,
    "threefry_kernel": train.THREEFRY_KERNEL[args.threefry_kernel],
    "quantizer_backend": args.quantizer_backend,
  }
  trainer = train.Trainer(config, model_overrides=overrides)
  state = trainer.init_state()
  lowered = trainer.train_step.trace(state, trainer.place(trainer.stream.batch(0)), trainer.quant_key(0))
  result = census(lowered.lower(lowering_platforms=("cuda",)).as_text())
  calls = sum(result["threefry_calls"].values())
  share = result["threefry_ops"] / result["inlined_ops"]
  print(
    f"{args.model} {args.recipe}, scan_unroll {args.scan_unroll}, threefry kernel {args.threefry_kernel}, "
    f"quantizer backend {args.quantizer_backend}"
  )
  print(f"inlined operations {result['inlined_ops']:,}; threefry calls {calls}, {share:.0%} of the operations")
  for caller, n in result["threefry_calls"].most_common():
    print(f"  {n:5d} from {caller}")


if __name__ == "__main__":
  main()
