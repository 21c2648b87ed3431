"""Check that sharded training computes what one device computes: quantized operands and loss curves per layout.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 fp4jax-layout-check \\
      --recipes bf16,nvidia_nvfp4 --meshes data=4 data=4:fsdp model=2 data=2,model=2 --data CORPUS

prints one JSON object per check as it finishes (and ``--out FILE`` writes them all):

``{"check": "operands", "recipe", "mesh", "spec", "equal"}``: every quantized operand of the recipe
(``fp4jax.operand.rotate`` + ``quantize_operand``, the exact path of ``fp4jax.dot_general``) on a (tokens, features)
array sharded along its rows, its columns (the contraction axis) or both, against the same jitted function on one
device; ``equal`` means values and scale agree bit for bit.

``{"check": "loss", "recipe", "mesh", "grad_comm_dtype", "losses", "reference", "grad_norms", "reference_grad_norms",
"max_abs_diff", "max_ulp_diff", "bit_identical", "state_identical", "differing_params", "collectives",
"all_reduce_dtypes"}``: ``--steps`` training steps of ``fp4jax_experiments.train.Trainer`` on the mesh, once per
``--grad-comm-dtypes`` entry, against the same steps on one device (same data, same keys, fp32 gradients);
``state_identical``: the parameters and optimizer state after the last step are the same bytes;
``differing_params``: the paths of the parameters whose bytes differ (with ``--steps 1``, where the first
gradients differed). ``--deterministic R`` trains both with R fixed microbatches summed in a fixed order
(``fp4jax_experiments.deterministic``), which makes them bit-identical; a mesh with a model axis of T devices then
trains T tensor-parallel shards (``--tensor-shards T``), and so does its one-device reference.
``{"check": "backends", "recipe", "backend", "reference_backend", "losses", "reference", "max_abs_diff",
"max_ulp_diff", "bit_identical", "grad_norms", "reference_grad_norms"}``:
``--steps`` training steps on one device with the projections' quantizers run by ``--backends``' other entries
(e.g. the Pallas kernels), against the same steps with its first (XLA). The kernels give the XLA path's bits, so on
the CPU (interpret mode) the losses are bit-identical; on a GPU the two programs may still differ in the GEMMs that
XLA picks for them.

Without ``--deterministic``, bit-identical losses across layouts are not expected everywhere: a sum over a sharded
axis becomes per-shard partial sums plus an all-reduce, a different fp32 summation order (the wgrad GEMM over tokens
under data parallelism, the row-parallel GEMMs under tensor parallelism, the loss mean), and the rounding
differences that follow can flip bf16 / FP4 roundings downstream and grow through Adam's normalized updates. A
layout ``sharding.check_layout`` refuses for a
recipe gives ``{"check": "loss", "recipe", "mesh", "grad_comm_dtype", "rejected": message}``. ``collectives`` lists
the element types each kind of collective of the compiled train step moves (gradient all-reduces should be f32 unless
``--grad-comm-dtypes`` asks otherwise); ``all_reduce_dtypes`` those of the all-reduces the program asks for before
XLA's passes (XLA:CPU promotes bf16 all-reduces to f32 and f8 ones to f16 when it compiles them).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import fp4jax
from fp4jax._src.operand import quantize_operand, rotate
from fp4jax_experiments import deterministic, sharding, train
from fp4jax_experiments import model as model_lib

OPERAND_SHAPE = (512, 256)  # (rows, contraction): tokens x features, or the transposes of the backward GEMMs


def parse_layout(text: str) -> sharding.Layout:
  """``"data=4"`` or ``"data=4:fsdp"`` -> Layout."""
  mesh, _, flag = text.partition(":")
  if flag not in ("", "fsdp"):
    raise ValueError(f"layout {text!r}: the only suffix is ':fsdp'")
  return sharding.parse_mesh(mesh, fsdp=flag == "fsdp")


def operand_specs(recipe_name: str) -> dict[str, fp4jax.recipes.OperandSpec]:
  """The recipe's operands that are quantized or rotated, by field name (fwd_lhs, ..., wgrad_rhs)."""
  recipe = fp4jax.recipes.get(recipe_name)
  return {name: spec for name in sharding.OPERAND_AXES if not (spec := getattr(recipe, name)).is_identity}


def _quantizer(spec: fp4jax.recipes.OperandSpec) -> fp4jax.recipes.OperandSpec:
  """``spec`` without the fields that do not change the quantized operand (its source, its backward estimator)."""
  return dataclasses.replace(spec, source="input", estimator="ste")


def _quantize(x, spec, key):
  """One operand as ``fp4jax.dot`` quantizes it: rotate (if the GEMM has a Hadamard), then quantize."""
  if spec.hadamard:
    x = rotate(x, spec.hadamard, spec.sign_vector(key))
  op, _ = quantize_operand(x, spec, key)
  return op.values, op.scale


def _operand_shardings(layout: sharding.Layout, mesh) -> list[P]:
  """Placements of an operand: rows and columns (the contraction axis) each split over one mesh axis of size > 1
  (one axis: rows only, columns only; two: rows over one and columns over the other, both ways)."""
  axes = [a for a in sharding.AXES if getattr(layout, a) > 1]
  if len(axes) == 1:
    return [P(axes[0], None), P(None, axes[0])]
  return [P(*axes), P(*reversed(axes))]


def _bits(a) -> np.ndarray:
  a = np.asarray(jax.device_get(a))
  return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def check_operands(recipe_names, layouts, seed: int = 0) -> list[dict]:
  """Bit-compare every quantized operand of every recipe, sharded as each layout can shard it, with one device."""
  key = jax.random.key(seed)
  x = jax.random.normal(jax.random.fold_in(key, 1), OPERAND_SHAPE, jnp.float32)
  x = (x * jnp.exp(jax.random.normal(jax.random.fold_in(key, 2), (1, OPERAND_SHAPE[1])))).astype(jnp.bfloat16)
  operands = {(r, name): _quantizer(spec) for r in recipe_names for name, spec in operand_specs(r).items()}
  unique = list(dict.fromkeys(operands.values()))
  quantize_all = lambda x, key: [_quantize(x, spec, key) for spec in unique]  # noqa: E731
  reference = jax.device_get(jax.jit(quantize_all)(x, key))
  records = []
  for layout in layouts:
    mesh = sharding.make_mesh(layout)
    for pspec in _operand_shardings(layout, mesh):
      placed = jax.device_put(x, NamedSharding(mesh, pspec))
      got = jax.jit(quantize_all)(placed, jax.device_put(key, sharding.replicated(mesh)))
      same = [
        np.array_equal(_bits(v), _bits(rv)) and np.array_equal(_bits(s), _bits(rs))
        for (v, s), (rv, rs) in zip(got, reference)
      ]
      for (recipe, name), spec in operands.items():
        equal = bool(same[unique.index(spec)])
        records.append(
          {
            "check": "operands",
            "recipe": recipe,
            "mesh": layout.describe(),
            "sharding": str(pspec),
            "operand": name,
            "equal": equal,
          }
        )
  return records


_ALL_REDUCE = re.compile(r'"stablehlo\.all_reduce".*?\}\) : \(([^)]*)\)', re.DOTALL)


def all_reduce_dtypes(stablehlo_text: str) -> list[str]:
  """Element types of the all-reduces in a lowered (StableHLO) module, e.g. ``["bf16", "f32"]``."""
  return sorted(
    {
      t
      for operands in _ALL_REDUCE.findall(stablehlo_text)
      for t in re.findall(r"tensor<(?:[0-9]+x)*([a-zA-Z0-9]+)>", operands)
    }
  )


def _compared(losses: np.ndarray, ref: np.ndarray) -> dict:
  """How far float32 ``losses`` are from ``ref``: largest absolute and ulp differences, and bit identity."""
  ulps = np.abs(losses.view(np.int32).astype(np.int64) - ref.view(np.int32).astype(np.int64))
  return {
    "losses": losses.tolist(),
    "reference": ref.tolist(),
    "max_abs_diff": float(np.max(np.abs(losses - ref))),
    "max_ulp_diff": int(ulps.max()),
    "bit_identical": bool(ulps.max() == 0),
  }


def state_digests(state) -> dict[str, str]:
  """SHA-256 of the bytes of every leaf of ``state`` (gathered from its devices), by its path."""
  return {
    jax.tree_util.keystr(path): hashlib.sha256(np.ascontiguousarray(leaf).tobytes()).hexdigest()
    for path, leaf in jax.tree_util.tree_leaves_with_path(jax.device_get(state))
  }


def differing_leaves(digests: dict[str, str], reference: dict[str, str]) -> list[str]:
  """Paths of the leaves whose bytes differ from ``reference``'s (or that only one side has), sorted."""
  return sorted(path for path in digests.keys() | reference.keys() if digests.get(path) != reference.get(path))


def _losses(config: train.TrainConfig, layout, steps: int, model_overrides) -> dict:
  """The first ``steps`` losses and gradient norms, and the collectives' element types of the train step."""
  trainer = train.Trainer(config, layout=layout, model_overrides=model_overrides)
  state, metrics = trainer.init_state(), []
  batch = lambda step: trainer.place(trainer.stream.batch(step))  # noqa: E731
  lowered = trainer.train_step.lower(state, batch(0), trainer.quant_key(0))
  step_fn = lowered.compile()
  for step in range(steps):
    state, out = step_fn(state, batch(step), trainer.quant_key(step))
    metrics.append(out)
  metrics = jax.device_get(metrics)
  return {
    "losses": np.asarray([m["loss"] for m in metrics], np.float32),
    "state_digests": state_digests(state),
    "grad_norms": [float(m["grad_norm"]) for m in metrics],
    "collectives": {op: sorted(types) for op, types in sharding.collective_dtypes(step_fn.as_text()).items()},
    "all_reduce_dtypes": all_reduce_dtypes(lowered.as_text()),
  }


def check_losses(
  config: train.TrainConfig, recipe_names, layouts, steps: int, model_overrides=None, grad_comm_dtypes=("float32",)
) -> list[dict]:
  """Per recipe: ``steps`` losses on one device, then on each layout with each gradient communication dtype
  (``sharding.check_layout`` and ``sharding.check_grad_comm`` apply). With ``config.deterministic`` a layout with a
  model axis of T devices trains with ``tensor_shards=T``, against one device running the same T shards."""
  records = []
  for recipe in recipe_names:
    references = {}
    for layout in layouts:
      shards = layout.model if config.deterministic else 1
      for comm in grad_comm_dtypes:
        head = {"check": "loss", "recipe": recipe, "mesh": layout.describe(), "grad_comm_dtype": comm}
        run = dataclasses.replace(config, recipe=recipe, grad_comm_dtype=comm, tensor_shards=shards)
        try:
          got = _losses(run, layout, steps, model_overrides)
        except ValueError as err:  # check_layout / check_grad_comm refused the layout
          records.append({**head, "rejected": str(err)})
          print(json.dumps(records[-1]), flush=True)
          continue
        if shards not in references:
          references[shards] = _losses(
            dataclasses.replace(run, grad_comm_dtype="float32"), None, steps, model_overrides
          )
        reference = references[shards]
        differing = differing_leaves(got["state_digests"], reference["state_digests"])
        records.append(
          {
            **head,
            **_compared(got["losses"], reference["losses"]),
            "state_identical": not differing,
            "differing_params": [path for path in differing if path.startswith("['params']")],
            "grad_norms": got["grad_norms"],
            "reference_grad_norms": reference["grad_norms"],
            "collectives": got["collectives"],
            "all_reduce_dtypes": got["all_reduce_dtypes"],
          }
        )
        print(json.dumps(records[-1]), flush=True)
  return records


def check_backends(config: train.TrainConfig, recipe_names, backends, steps: int, model_overrides=None) -> list[dict]:
  """Per recipe: ``steps`` losses on one device with each quantizer backend after the first, against the first."""
  records = []
  for recipe in recipe_names:
    run = dataclasses.replace(config, recipe=recipe)
    got = {b: _losses(run, None, steps, {**(model_overrides or {}), "quantizer_backend": b}) for b in backends}
    ref = got[backends[0]]
    for backend in backends[1:]:
      records.append(
        {
          "check": "backends",
          "recipe": recipe,
          "backend": backend,
          "reference_backend": backends[0],
          **_compared(got[backend]["losses"], ref["losses"]),
          "grad_norms": got[backend]["grad_norms"],
          "reference_grad_norms": ref["grad_norms"],
        }
      )
      print(json.dumps(records[-1]), flush=True)
  return records


# quartet2's 128-point backward Hadamard needs d_model / model >= 128; the 100K model's d_model is 64
LOSS_MODEL_OVERRIDES = {"d_model": 256, "n_heads": 2, "ffn_hidden": 256}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="fp4jax-layout-check", description=__doc__.split("\n\n")[0])
  parser.add_argument("--recipes", default=",".join(fp4jax.recipes.names()), help="comma-separated recipe names")
  parser.add_argument(
    "--meshes",
    nargs="+",
    default=["data=4", "data=4:fsdp", "model=2", "data=2,model=2"],
    help="layouts: data=N, model=N, data=N,model=M, with ':fsdp' for FSDP",
  )
  parser.add_argument("--checks", default="operands,loss", help="comma-separated: operands, loss, backends")
  parser.add_argument(
    "--backends",
    default="xla,pallas",
    help="the backends check: quantizer backends, the first is the reference (default %(default)s)",
  )
  parser.add_argument(
    "--grad-comm-dtypes",
    default="float32",
    help=f"the sharded runs' gradient all-reduce dtypes, comma-separated, of {sharding.GRAD_COMM_DTYPES}",
  )
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument(
    "--deterministic",
    type=int,
    default=0,
    metavar="R",
    help="train with R fixed microbatches summed in a fixed order (fp4jax_experiments.deterministic)",
  )
  parser.add_argument("--data", default="stdlib")
  parser.add_argument("--model", default="100K")
  parser.add_argument(
    "--model-overrides",
    default=json.dumps(LOSS_MODEL_OVERRIDES),
    help="JSON ModelConfig fields of the loss check's model (default %(default)s: the smallest "
    "on which every recipe fits the default meshes, with 2 heads so model=2 splits attention)",
  )
  parser.add_argument("--batch-size", type=int, default=8)
  parser.add_argument("--seq-len", type=int, default=64)
  parser.add_argument("--out", default=None, help="also write the records to this JSON file")
  args = parser.parse_args(argv)
  recipes = args.recipes.split(",")
  layouts = [parse_layout(text) for text in args.meshes]
  checks = set(args.checks.split(","))
  if unknown := checks - {"operands", "loss", "backends"}:
    parser.error(f"--checks: unknown {sorted(unknown)}; choose from operands, loss, backends")
  backends = args.backends.split(",")
  if len(backends) < 2 or not set(backends) <= set(model_lib.QUANTIZER_BACKENDS):
    parser.error(f"--backends must name at least two of {model_lib.QUANTIZER_BACKENDS}, got {args.backends!r}")
  if args.deterministic:
    deterministic.set_gpu_flags()
  records = []
  if "operands" in checks:
    records += check_operands(recipes, layouts)
    for record in records:
      print(json.dumps(record), flush=True)
  config = train.TrainConfig(
    model=args.model,
    data=args.data,
    batch_size=args.batch_size,
    seq_len=args.seq_len,
    tokens=args.batch_size * args.seq_len * args.steps,
    lr=3e-3,
    deterministic=args.deterministic,
  )
  overrides = json.loads(args.model_overrides) if args.model_overrides else None
  if "loss" in checks:
    records += check_losses(config, recipes, layouts, args.steps, overrides, args.grad_comm_dtypes.split(","))
  if "backends" in checks:
    records += check_backends(config, recipes, backends, args.steps, overrides)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(records, f, indent=1)


if __name__ == "__main__":
  main()
