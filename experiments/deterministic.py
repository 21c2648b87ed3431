"""Layout-independent data-parallel steps: R fixed microbatches and fixed-order sums (``--deterministic R``).

Under plain sharded ``jit`` a step's sums split into per-device partials and an all-reduce in an order the mesh
sets, and each device's GEMMs have other shapes, so the loss parts in its last bits and the FP4 roundings amplify
them. ``--deterministic R`` defines the step by R microbatches, and every layout computes exactly that step:

* The batch of B rows is cut into R microbatches of B/R consecutive rows, each a logical tensor of its own
  (gradient-accumulation semantics): its own NVFP4 tensor amax, random bits from the key ``fold_in(k, r)``.
* ``loss = Σ_r ℓ_r`` and ``grads = Σ_r ∇ℓ_r`` with ``ℓ_r = Σ_{tokens of r} cross-entropy / (B·T)``, both summed
  over r by the balanced pairwise tree of ``fp4jax.reductions.leading_pairwise_sum`` (R a power of two).
* On a data axis of D devices (D divides R), under ``jax.shard_map`` device d runs microbatches d·R/D … (d+1)·R/D − 1
  one after another (``lax.map``, the one-device shapes), adds them by the tree's lower levels, and
  ``fp4jax.sharding.ordered_psum`` adds the D partials by its upper levels. Parameters enter replicated (FSDP:
  all-gathered, exact) and gradients leave replicated; the cost is R/D stacked fp32 gradients per device, GEMMs of
  B/R rows, and an all-to-all plus an all-gather per gradient leaf.

Tensor parallelism (``--tensor-shards T``, T a power of two) defines the step by T Megatron shards as well
(``fp4jax_experiments.model.TensorParallel``): shard s holds heads and hidden units s·n/T … (s+1)·n/T − 1; the
row-parallel outputs and block-input gradients are pairwise-tree sums over s (``fp4jax.sharding.sum_from_shards``,
``copy_to_shards``), and every FP4 operand the split cuts is quantized as the logical tensor
(``fp4jax.sharding.sharded``). A mesh with a model axis of T runs shard s on its device s; a mesh without one runs the
T shards under ``jax.vmap`` with the same axis name (:func:`over_model_shards`). T = 1 is the plain model.

So every layout adds the same floats in the same order. Equal bits also need XLA to give each op the same bits
whatever its shape and batching: on the CPU it does (the GEMMs take f32 operands, ``fp4jax.operand.matmul``); on a
GPU batched (``vmap``) and per-device GEMMs round differently. Runs of one program on a GPU are reproducible with
``XLA_FLAGS=--xla_gpu_deterministic_ops=true --xla_gpu_autotune_level=0`` (GEMM algorithms chosen by shape alone),
which the training CLI sets for deterministic jobs (:func:`set_gpu_flags`).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from fp4jax._src.reductions import leading_pairwise_sum
from fp4jax.sharding import ordered_psum
from fp4jax_experiments.sharding import DATA, MODEL, Layout, leaf_spec

GPU_XLA_FLAGS = ("--xla_gpu_deterministic_ops=true", "--xla_gpu_autotune_level=0")


def set_gpu_flags(environ=os.environ) -> None:
  """Append :data:`GPU_XLA_FLAGS` to ``XLA_FLAGS`` (those not set already). XLA reads the variable when JAX starts
  its backend, so call this before the first JAX computation; the flags are harmless on a CPU."""
  flags = environ.get("XLA_FLAGS", "").split()
  given = {flag.split("=")[0] for flag in flags}
  environ["XLA_FLAGS"] = " ".join(flags + [f for f in GPU_XLA_FLAGS if f.split("=")[0] not in given])


def check(
  microbatches: int, batch_size: int, layout: Layout | None, grad_comm_dtype: str = "float32", tensor_shards: int = 1
) -> None:
  """Raise ValueError unless ``--deterministic microbatches --tensor-shards tensor_shards`` can run ``batch_size``
  rows on ``layout``."""
  head = f"--deterministic {microbatches}"
  if microbatches < 1 or microbatches & (microbatches - 1):
    raise ValueError(f"{head}: the number of microbatches must be a power of two (the pairwise tree)")
  if tensor_shards < 1 or tensor_shards & (tensor_shards - 1):
    raise ValueError(f"--tensor-shards {tensor_shards} must be a power of two (the pairwise tree over shards)")
  if batch_size % microbatches:
    raise ValueError(f"{head}: batch_size={batch_size} does not split into {microbatches} equal microbatches")
  if grad_comm_dtype != "float32":
    raise ValueError(
      f"{head} adds fp32 gradients in a fixed order; --grad-comm-dtype must be float32, got {grad_comm_dtype}"
    )
  if layout is None:
    return
  if layout.model not in (1, tensor_shards):
    raise ValueError(
      f"{head}: the mesh's model axis ({layout.model} devices) must be 1 or --tensor-shards "
      f"({tensor_shards}): tensor-parallel numerics are defined by the number of shards; pass --tensor-shards "
      f"{layout.model} (and the same on one device to reproduce the run)"
    )
  if microbatches % layout.data:
    raise ValueError(f"{head}: the data axis ({layout.data} devices) must divide the number of microbatches")


def microbatched(fn: Callable, mesh: Mesh, microbatches: int, param_specs=P(), out_specs=P()) -> Callable:
  """``(params, batch, key) -> Σ_r fn(params, rows_r, fold_in(key, r), B)`` over the R = ``microbatches`` row
  blocks of ``batch`` (B rows), summed leaf by leaf by the pairwise tree over r, for ``jax.jit``.

  ``fn(params, rows, key, total_rows)`` returns a pytree of fp32 arrays (a loss share, or a loss share and its
  gradients). Runs under ``jax.shard_map`` on ``mesh``'s data axis (D devices, D | R): parameters as
  ``param_specs`` (replicated over the data axis; split over the model axis for a tensor-parallel ``fn``), key
  replicated, batch ``P("data", None)``, output as ``out_specs`` (see the module docstring).
  """

  def local(params, batch, key):
    devices = lax.axis_size(DATA)
    per_device = microbatches // devices
    rows = batch.reshape(per_device, batch.shape[0] // per_device, *batch.shape[1:])
    first = lax.axis_index(DATA) * per_device
    total_rows = batch.shape[0] * devices

    def one(args):
      index, block = args
      return fn(params, block, jax.random.fold_in(key, index), total_rows)

    results = lax.map(one, (first + jnp.arange(per_device), rows))
    return jax.tree.map(lambda x: ordered_psum(leading_pairwise_sum(x), DATA), results)

  # check_vma=False: ordered_psum's all-gather leaves the same value on every device, which the varying-axes
  # check cannot see; without it, gradients of the replicated parameters also get no implicit psum.
  return jax.shard_map(
    local, mesh=mesh, in_specs=(param_specs, P(DATA, None), P()), out_specs=out_specs, check_vma=False
  )


def _is_spec(x) -> bool:
  return isinstance(x, P)


def _split_dim(spec: P) -> int | None:
  return next((i for i, name in enumerate(spec) if name == MODEL), None)


def param_specs(params, tensor_shards: int):
  """Per parameter leaf, its ``PartitionSpec`` over the model axis alone (``fp4jax_experiments.sharding.leaf_spec`` of
  ``--mesh model=T``): column-parallel kernels split on their outputs, row-parallel on their inputs, the rest
  replicated."""
  layout = Layout(model=tensor_shards)
  return jax.tree_util.tree_map_with_path(lambda path, leaf: leaf_spec(path, leaf.shape, layout), params)


def over_model_shards(fn: Callable, specs_in, specs_out, tensor_shards: int, mesh: Mesh) -> Callable:
  """``fn(params, *args)``, a shard's computation with collectives over the axis "model", run for all
  ``tensor_shards`` shards: as is inside ``shard_map`` on a mesh whose model axis has that many devices (each holds
  its slices, ``specs_in``), else (model axis 1) under ``jax.vmap`` with the axis name "model": each parameter
  leaf split along its ``specs_in`` dim into the shards' slices, each output leaf joined along its ``specs_out``
  dim (replicated outputs, the same on every shard, taken from shard 0)."""
  if mesh.shape[MODEL] == tensor_shards:
    return fn
  if mesh.shape[MODEL] != 1:
    raise ValueError(f"mesh model axis {mesh.shape[MODEL]} must be 1 or the tensor shards ({tensor_shards})")

  def split(x, spec):
    dim = _split_dim(spec)
    if dim is None:
      return x
    parts = x.reshape(*x.shape[:dim], tensor_shards, x.shape[dim] // tensor_shards, *x.shape[dim + 1 :])
    return jnp.moveaxis(parts, dim, 0)

  def join(x, spec):
    dim = _split_dim(spec)
    if dim is None:
      return x[0]
    parts = jnp.moveaxis(x, 0, dim)
    return parts.reshape(*parts.shape[:dim], parts.shape[dim] * parts.shape[dim + 1], *parts.shape[dim + 2 :])

  def virtual(params, *args):
    axes = jax.tree.map(lambda spec: None if _split_dim(spec) is None else 0, specs_in, is_leaf=_is_spec)
    shards = jax.vmap(fn, in_axes=(axes, *[None] * len(args)), axis_name=MODEL, axis_size=tensor_shards)
    out = shards(jax.tree.map(split, params, specs_in, is_leaf=_is_spec), *args)
    return jax.tree.map(lambda spec, x: join(x, spec), specs_out, out, is_leaf=_is_spec)

  return virtual
