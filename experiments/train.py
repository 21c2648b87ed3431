"""Train a Llama-style model under one recipe: JSONL metrics, orbax checkpoints, exact resume.

  fp4jax-train --recipe quartet2 --model 10M --tokens 200M --data stdlib --out runs/q2-10M

Loss: mean next-token cross-entropy ℓ = −(1/BT)·Σ log softmax(logits)[target] in nats; bits per byte =
ℓ / (ln 2 · bytes_per_token) (byte-level corpora: bytes_per_token = 1). Steps = ⌊tokens / (batch·seq)⌋.

Run folder (``--out``): ``config.json`` (the run's identity; a rerun with another config is refused),
``metrics.jsonl`` (records {"kind": "train" | "val" | "quant_error", "step", "tokens", ...}), ``ckpt/`` (orbax: fp32
params and optimizer state at step s; s is also the data stream's position), ``summary.json`` (once finished: the
final losses and :func:`provenance`, the commit, device, JAX version and date of the piece that finished it).
Rerunning the same command resumes from the newest checkpoint, drops metric records after it, and reproduces
the uninterrupted run bit for bit: batches are a function of the step, the "quant" key of step s is
fold_in(key(seed), s), and every record of step s is written before the checkpoint of step s.
``--max-minutes`` pauses (checkpoint, exit 0, status "paused") before the budget runs out. ``--quantizer-backend
pallas|auto`` quantizes with the fused Pallas kernels (one device, a data-parallel mesh, or any mesh with
``--deterministic``; the same bits as XLA's quantizers, so, like the mesh, it is not part of config.json).

Several devices (``experiments.sharding``): ``--mesh data=4`` (data parallel), ``--mesh data=4 --fsdp`` (parameters and
optimizer state sharded over the data axis), ``--mesh data=2,model=2`` (with Megatron-style tensor parallelism). The
layout is not part of config.json: a run may resume on another mesh. Several hosts: start the same command on every
host with ``--distributed --coordinator HOST0:PORT --num-processes N --process-id I`` (``jax.distributed.initialize``;
on SLURM / Open MPI the three values can be left out), a ``--mesh`` spanning all devices of all hosts, and an
``--out`` on a filesystem they share; process 0 writes the metrics. On a data-parallel mesh (``--mesh data=N``, with
or without ``--fsdp``) an FP4 model without MoE experts trains under ``shard_map``: each data shard differentiates its
share of the loss with token-sharded FP4 recipes, quantized by the kernels, so the quantized operands stay those of
one device (:func:`token_sharded_data_parallel`); the gradients are all-reduced in ``--grad-comm-dtype`` (float32,
or bfloat16 / float8_e4m3fn: ``sharding.all_reduce_sum``) after the backward pass, or with
``ModelConfig.grad_sum="per_block"`` each block's inside the layer loop (the same sums: :func:`per_block_grad_sums`).
On a model axis (``--mesh model=T``, or
``data=D,model=T``, with or without ``--fsdp``) it runs as T Megatron shards under ``shard_map``, token-sharded
too beside a data axis (:func:`tensor_parallel_shards`). ``--quantizer-backend xla`` and MoE models keep the plain
sharded ``jit`` of the global program, with XLA's quantizers.

``--deterministic R`` (``experiments.deterministic``; part of config.json, since it changes the numerics): each step
is R fixed microbatches whose losses and gradients are added in a fixed order, so the loss curve and the trained
parameters are bit-identical on one device and on any ``--mesh data=D`` (D dividing R), with or without ``--fsdp``.
``--tensor-shards T`` adds tensor parallelism to that definition: the blocks computed as T Megatron shards, the same
bits on ``--mesh model=T`` / ``data=D,model=T`` as on one device or ``--mesh data=D`` (which run the T shards side by
side). On a GPU it also sets ``--xla_gpu_deterministic_ops=true --xla_gpu_autotune_level=0`` in XLA_FLAGS.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Literal, Self, get_args

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax import lax
from jax.sharding import PartitionSpec as P

from fp4jax_experiments import cli, data, deterministic, diagnostics, lowering, optimizer, sharding
from fp4jax_experiments import model as model_lib

QUANT_KEY_SALT = 1
EVAL_KEY_SALT = 2
FINAL_EVAL = "final_eval.json"  # per-batch validation losses of a finished run (train's final_eval_batches)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything that determines a run's loss curve (saved as config.json; a resume must match it)."""

  model: str = "1M"
  recipe: str = model_lib.BF16_RECIPE
  tokens: int = 1_000_000
  data: str = "stdlib"
  batch_size: int = 16
  seq_len: int = 128
  lr: float | None = None  # None: the size table's learning rate
  warmup_frac: float = 0.1
  weight_decay: float = 0.1
  clip_norm: float = 1.0
  seed: int = 0
  bf16_first: int = 0
  bf16_last: int = 0
  dtype: str = "bfloat16"
  attention_impl: str | None = None
  token_dtype: str | None = None
  log_every: int = 10
  eval_every: int = 100
  eval_batches: int = 4
  ckpt_every: int = 100
  quant_error_every: int = 0  # 0: never
  grad_comm_dtype: str = "float32"  # data-parallel gradient all-reduce dtype (sharding.GRAD_COMM_DTYPES)
  deterministic: int = 0  # R > 0: R fixed microbatches, sums in a fixed order (experiments.deterministic)
  tensor_shards: int = 1  # with deterministic: the blocks as T Megatron shards (experiments.deterministic)
  causal_amax: bool = False  # fp4jax.recipes.causal(recipe): per-token amax of X, a strictly causal forward

  def __post_init__(self):
    for name in ("tokens", "batch_size", "seq_len", "log_every", "eval_every", "eval_batches", "ckpt_every"):
      if getattr(self, name) <= 0:
        raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
    if self.quant_error_every < 0:
      raise ValueError(f"quant_error_every={self.quant_error_every} must be >= 0 (0 turns it off)")
    if self.ckpt_every % self.log_every:
      raise ValueError(
        f"ckpt_every={self.ckpt_every} must be a multiple of log_every={self.log_every} "
        "(a checkpoint must not split a logging window, or a resumed curve would differ)"
      )
    if self.tokens < self.tokens_per_step:
      raise ValueError(f"tokens={self.tokens} is less than one step of batch_size·seq_len={self.tokens_per_step}")
    if self.lr is not None and not 0 < self.lr < math.inf:
      raise ValueError(f"lr={self.lr} must be positive and finite")
    if not 0 <= self.warmup_frac < 1:
      raise ValueError(f"warmup_frac={self.warmup_frac} must be in [0, 1)")
    if not 0 <= self.weight_decay < math.inf:
      raise ValueError(f"weight_decay={self.weight_decay} must be >= 0 and finite")
    if not 0 < self.clip_norm < math.inf:
      raise ValueError(f"clip_norm={self.clip_norm} must be positive and finite")
    if self.dtype not in ("bfloat16", "float32"):
      raise ValueError(f"dtype={self.dtype!r} must be 'bfloat16' or 'float32'")
    if self.grad_comm_dtype not in sharding.GRAD_COMM_DTYPES:
      raise ValueError(f"grad_comm_dtype={self.grad_comm_dtype!r} must be one of {sharding.GRAD_COMM_DTYPES}")
    if self.deterministic < 0:
      raise ValueError(f"deterministic={self.deterministic} must be >= 0 (0 turns it off)")
    if self.tensor_shards != 1 and not self.deterministic:
      raise ValueError(
        f"tensor_shards={self.tensor_shards} needs deterministic > 0 (without it, tensor "
        "parallelism is --mesh model=N under XLA's partitioner)"
      )
    if self.deterministic:
      deterministic.check(self.deterministic, self.batch_size, None, self.grad_comm_dtype, self.tensor_shards)

  @property
  def tokens_per_step(self) -> int:
    return self.batch_size * self.seq_len

  @property
  def steps(self) -> int:
    return self.tokens // self.tokens_per_step

  @property
  def peak_lr(self) -> float:
    return self.lr if self.lr is not None else model_lib.SIZES[self.model].lr


def parse_count(text: str) -> int:
  """'200M' → 200_000_000; accepts k/M/B/T suffixes, plain integers and floats like '2e6'."""
  match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kKmMbBtT]?)\s*", text)
  if not match:
    raise argparse.ArgumentTypeError(f"{text!r} is not a count like 200M, 1.5B, 100k or 2e6")
  scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[match.group(2).lower()]
  return int(round(float(match.group(1)) * scale))


FLOAT_RANGES = {
  "positive": (lambda x: x > 0, "a positive finite number"),
  "non_negative": (lambda x: x >= 0, "a finite number >= 0"),
  "fraction": (lambda x: 0 <= x < 1, "a number in [0, 1)"),
}


def finite_float(kind: Literal["positive", "non_negative", "fraction"]):
  """An argparse ``type``: a float that is finite and ``kind`` (argparse names the flag in its error)."""
  accepts, expected = FLOAT_RANGES[kind]

  def parse(text: str) -> float:
    try:
      value = float(text)
    except ValueError:
      value = math.nan
    if not (math.isfinite(value) and accepts(value)):
      raise argparse.ArgumentTypeError(f"{text!r} is not {expected}")
    return value

  parse.__name__ = kind  # argparse's message for other errors
  return parse


def next_token_loss(logits: jax.Array, tokens: jax.Array, total_rows: int | None = None) -> jax.Array:
  """Mean cross-entropy (nats) of logits (B, T, V) for targets tokens (B, T).

  ``total_rows``: these rows are a shard of a batch of ``total_rows`` rows; returns their share of that batch's
  mean, Σ ce / (total_rows·T), whose gradient per token is the global mean's, f32(1/(total_rows·T)).
  """
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens)
  return ce.mean() if total_rows is None else ce.sum() / (total_rows * tokens.shape[1])


def token_sharded_data_parallel(layout: sharding.Layout | None, config: TrainConfig, model_config) -> bool:
  """Whether a step on ``layout`` differentiates each data shard's share of the loss under ``jax.shard_map`` with
  token-sharded FP4 recipes (``sharding.data_parallel_value_and_grad``, ``sharding.token_sharded_model``: each device
  quantizes its token shard with the collective amax, so the operands are one device's) instead of the plain sharded
  ``jit``.

  Only on a data-parallel mesh (several devices, no model axis; FSDP allowed) outside ``deterministic=R``. There it
  is needed for a ``grad_comm_dtype`` other than float32, and it is the default for a model with FP4 projections
  (``model_config``: a ``model.ModelConfig``) whose quantizer backend is not "xla" and that has no MoE experts:
  XLA's partitioner cannot split the quantizer kernels, so the plain ``jit`` would run XLA's quantizers.
  """
  if layout is None or layout.n_devices == 1 or layout.model > 1 or config.deterministic:
    return False
  if config.grad_comm_dtype != "float32":
    return True
  return has_fp4_blocks(model_config) and model_config.quantizer_backend != "xla" and not model_config.num_experts


def per_block_grad_sums(layout: sharding.Layout, config: TrainConfig, model_config) -> tuple[str, ...]:
  """The layer stacks whose gradients a :func:`token_sharded_data_parallel` step sums inside its backward pass's
  layer loop (``ModelConfig.grad_sum="per_block"``, ``sharding.block_grad_sum``): every stack, for float32 and
  bfloat16 gradients without FSDP (which reduce-scatters); none otherwise (the sums after the backward pass)."""
  if model_config.grad_sum != "per_block" or layout.fsdp or config.grad_comm_dtype not in sharding.PER_BLOCK_SUM_DTYPES:
    return ()
  return tuple(s.name for s in model_lib.layer_stacks(model_config))


def tensor_parallel_shards(layout: sharding.Layout | None, config: TrainConfig, model_config) -> bool:
  """Whether a step on ``layout`` runs the model written out as Megatron shards under ``jax.shard_map`` over the
  model axis (``model.TensorParallel``: FP4 recipes marked with their split, ``fp4jax.sharding.sharded``, so every
  quantized operand is the one-device operand, and the kernels quantize the shards' slices) instead of the plain
  sharded ``jit``: the default for a model with FP4 blocks and a quantizer backend other than "xla" on a mesh with
  a model axis, outside ``deterministic=R`` (which has its own shard_map step). With a data axis too, the batch is
  split over it, the recipes are marked with the tokens as well (each shard's operands are its blocks of the
  one-device operands) and the data shards' gradients are summed in float32 (with ``--fsdp``, reduce-scattered to
  the parameters' shards); there a model with MoE experts (``fp4jax.ragged_dot`` takes no sharded recipe) keeps
  the partitioned ``jit`` (XLA's quantizers)."""
  if layout is None or layout.model == 1 or config.deterministic:
    return False
  if layout.data > 1 and model_config.num_experts:
    return False
  return has_fp4_blocks(model_config) and model_config.quantizer_backend != "xla"


def has_fp4_blocks(model_config) -> bool:
  """Whether some block of ``model_config`` (a ``model.ModelConfig``) runs an FP4 recipe, i.e. has quantizers."""
  return any(s.recipe != model_lib.BF16_RECIPE for s in model_lib.layer_stacks(model_config))


def quantizer_backend_for(backend: str, layout: sharding.Layout | None, config: TrainConfig, model_config) -> str:
  """The projections' quantizer backend on ``layout``: ``backend`` as given on one device, for a model without FP4
  blocks (nothing to quantize), under ``deterministic=R`` (each device quantizes whole microbatches) and where
  :func:`token_sharded_data_parallel` holds for ``model_config`` with ``backend`` (data parallelism under
  ``shard_map``: each device quantizes its token shard with the kernels' collective amax); "auto" where
  :func:`tensor_parallel_shards` holds (a model axis, with or without a data axis: the kernels quantize the
  shards' slices they take, XLA the others); on a mesh of several devices otherwise (MoE experts on a mesh: XLA's
  partitioner, which cannot split a kernel), "auto" is XLA's quantizers and "pallas" / "native" raise ValueError
  naming the mesh."""
  if layout is None or layout.n_devices == 1 or config.deterministic or backend == "xla":
    return backend
  asked = dataclasses.replace(model_config, quantizer_backend=backend)
  if not has_fp4_blocks(model_config) or token_sharded_data_parallel(layout, config, asked):
    return backend
  if backend == "auto" and tensor_parallel_shards(layout, config, asked):
    return backend  # the kernels on the slices they take, XLA on the others ("pallas" would raise on those)
  if backend != "auto":
    raise ValueError(
      f"quantizer_backend={backend!r} trains on one device, or on a mesh with deterministic=R (--deterministic R: "
      "each device quantizes whole microbatches), or data parallel without MoE experts (no model axis: each device "
      f"quantizes its token shard); with the mesh {layout.describe()} use 'auto' or 'xla'"
    )
  return "xla"


class Trainer:
  """Model, optimizer, data and the jitted steps of one run.

  ``layout`` (``experiments.sharding.Layout``): shard parameters, optimizer state and batches over a device mesh
  (None: one device). ``model_overrides``: ModelConfig fields replacing the size table's (tests).
  """

  def __init__(
    self,
    config: TrainConfig,
    cache_dir: str | None = None,
    layout: sharding.Layout | None = None,
    model_overrides: dict | None = None,
  ):
    self.config = config
    self.corpus = data.load_corpus(config.data, cache_dir, config.token_dtype)
    fields = dict(
      vocab_size=self.corpus.vocab_size,
      recipe=config.recipe,
      bf16_first=config.bf16_first,
      bf16_last=config.bf16_last,
      dtype=jnp.dtype(config.dtype),
      # auto: cuDNN's flash attention on a GPU, but XLA's under --deterministic (its backward's sums in a fixed order)
      attention_impl=config.attention_impl or ("xla" if config.deterministic else "auto"),
      causal_amax=config.causal_amax,
    )
    fields.update(model_overrides or {})
    asked = model_lib.model_config(config.model, **fields)
    backend = quantizer_backend_for(asked.quantizer_backend, layout, config, asked)
    self.model_config = dataclasses.replace(asked, quantizer_backend=backend)
    model_lib.projection_dot_cls(config.recipe)  # fail now, not after the data and compile, if fp4jax lacks it
    self.model = model_lib.Llama(self.model_config)
    self.schedule = optimizer.lr_schedule(config.peak_lr, config.steps, config.warmup_frac)
    self.optimizer = optimizer.adamw(
      self.schedule,
      weight_decay=config.weight_decay,
      clip_norm=config.clip_norm,
    )
    self.stream = data.BatchStream(self.corpus.train, config.batch_size, config.seq_len, config.seed)
    self.eval_set = data.eval_batches(self.corpus.val, config.batch_size, config.seq_len, config.eval_batches)
    self.key = jax.random.key(config.seed)
    sharding.check_grad_comm(config.grad_comm_dtype, layout)
    if config.deterministic and layout is None:  # its steps run under shard_map on a 1x1 mesh: so do the inputs
      layout = sharding.Layout()  # (else the second step, fed the first's mesh-placed state, compiles again)
    self.layout = layout
    self.value_and_grad = jax.value_and_grad(self._loss)
    self.eval_fn = self._loss
    if config.deterministic:
      self._deterministic_steps(layout or sharding.Layout())
    if layout is None:
      self.train_step = jax.jit(self._train_step, donate_argnums=0)
      self.eval_loss = jax.jit(self.eval_fn)
    else:
      self._sharded_steps(layout)
    # lowered under the model's JAX config values (the threefry kernel lowering), at every call: they key jit's cache
    flags = self.model_config.jax_config()
    self.train_step = lowering.Scoped(self.train_step, flags)
    self.eval_loss = lowering.Scoped(self.eval_loss, flags)

  def _sharded_steps(self, layout: sharding.Layout) -> None:
    """The jitted steps of a run on ``layout``'s mesh (data parallel, FSDP, tensor parallel)."""
    config = self.config
    if not config.deterministic:
      sharding.check_layout(layout, self.model_config, config.batch_size, config.seq_len)
    self.mesh = sharding.make_mesh(layout)
    token_sharded = token_sharded_data_parallel(layout, config, self.model_config)
    summed = per_block_grad_sums(layout, config, self.model_config) if token_sharded else ()
    if token_sharded:
      model = self.model
      if summed:
        model = model.clone(block_grad_sum=sharding.block_grad_sum(config.grad_comm_dtype))
      loss_share = functools.partial(self._loss, model=sharding.token_sharded_model(model))
      # evaluation is the plain sharded jit, whose partitioner cannot split a Pallas kernel: XLA's quantizers there
      # (the same bits as the kernels)
      xla_model = model_lib.Llama(dataclasses.replace(self.model_config, quantizer_backend="xla"))
      self.eval_fn = functools.partial(self._loss, model=xla_model)
    self.state_sharding = sharding.state_shardings(jax.eval_shape(self._init_state), self.mesh, layout)
    if tensor_parallel_shards(layout, config, self.model_config):
      self._tensor_parallel_steps(layout)
    if token_sharded:
      # with --fsdp the parameters enter sharded (all-gathered whole in each shard, gradients reduce-scattered)
      specs = jax.tree.map(lambda s: s.spec, self.state_sharding["params"]) if layout.fsdp else None
      self.value_and_grad = sharding.data_parallel_value_and_grad(
        loss_share, self.mesh, config.grad_comm_dtype, specs, summed
      )
    self.batch_sharding = sharding.batch_sharding(self.mesh)
    rep = sharding.replicated(self.mesh)
    self.train_step = jax.jit(
      self._train_step,
      donate_argnums=0,
      out_shardings=(self.state_sharding, rep),
      in_shardings=(self.state_sharding, self.batch_sharding, rep),
    )
    self.eval_loss = jax.jit(
      self.eval_fn, out_shardings=rep, in_shardings=(self.state_sharding["params"], self.batch_sharding, rep)
    )

  def _deterministic_steps(self, layout: sharding.Layout) -> None:
    """``--deterministic R`` (``experiments.deterministic``): the loss and gradients of R microbatches summed in
    a fixed order; with ``--tensor-shards T`` > 1, of the model written out as T Megatron shards."""
    config, shards = self.config, self.config.tensor_shards
    deterministic.check(config.deterministic, config.batch_size, layout, config.grad_comm_dtype, shards)
    sharding.check_layout(
      dataclasses.replace(layout, model=shards),
      self.model_config,
      config.batch_size,
      config.seq_len,
      microbatches=config.deterministic,
    )
    mesh = sharding.make_mesh(layout)
    loss, value_and_grad, specs = self._loss, self.value_and_grad, P()
    if shards > 1:
      loss, specs = self._megatron_loss(shards), self._megatron_specs(shards)
      value_and_grad = deterministic.over_model_shards(jax.value_and_grad(loss), specs, (P(), specs), shards, mesh)
      loss = deterministic.over_model_shards(loss, specs, P(), shards, mesh)
    self.value_and_grad = deterministic.microbatched(value_and_grad, mesh, config.deterministic, specs, (P(), specs))
    self.eval_fn = deterministic.microbatched(loss, mesh, config.deterministic, specs)

  def _tensor_parallel_steps(self, layout: sharding.Layout) -> None:
    """The loss and gradients of the model written out as ``layout.model`` Megatron shards (``model.TensorParallel``),
    shard s on the devices of model index s under ``jax.shard_map``, the key on every device
    (:func:`tensor_parallel_shards`). The shards' sums are the pairwise tree of ``fp4jax.sharding.sum_from_shards``.
    The whole batch on every device; with a data axis, its rows split over it, each data shard differentiating its
    share of the loss (``sharding.data_parallel_value_and_grad``, float32 sums over "data"; with ``--fsdp`` the
    parameters enter sharded over both axes and each data shard gathers its Megatron slices whole)."""
    if layout.data > 1:
      loss = self._megatron_loss(layout.model, tokens=sharding.DATA)
      specs = jax.tree.map(lambda s: s.spec, self.state_sharding["params"])  # Megatron's, and FSDP's with --fsdp
      self.value_and_grad = sharding.data_parallel_value_and_grad(loss, self.mesh, self.config.grad_comm_dtype, specs)

      def shares(params, batch, key):
        params = sharding.gather_params(params, specs)
        return lax.psum(loss(params, batch, key, batch.shape[0] * lax.axis_size(sharding.DATA)), sharding.DATA)

      in_specs = (specs, P(sharding.DATA, None), P())
      self.eval_fn = jax.shard_map(shares, mesh=self.mesh, in_specs=in_specs, out_specs=P(), check_vma=False)
      return
    loss, specs = self._megatron_loss(layout.model), self._megatron_specs(layout.model)
    # check_vma=False: the kernels' pallas_call outputs carry no varying-axes type; the replicated parameters'
    # gradients are the same on every shard (Megatron's conjugate operators), so none is summed over the shards
    self.value_and_grad = jax.shard_map(
      jax.value_and_grad(loss), mesh=self.mesh, in_specs=(specs, P(), P()), out_specs=(P(), specs), check_vma=False
    )
    self.eval_fn = jax.shard_map(loss, mesh=self.mesh, in_specs=(specs, P(), P()), out_specs=P(), check_vma=False)

  def _megatron_loss(self, shards: int, tokens: str | None = None):
    """The loss of the model written out as ``shards`` Megatron shards (``model.TensorParallel``, one shard's
    computation with collectives over the axis "model"; its recipes also marked with the tokens split over the axis
    ``tokens``, if given)."""
    tp = model_lib.Llama(self.model_config, model_lib.TensorParallel(sharding.MODEL, shards, tokens))
    return functools.partial(self._loss, model=tp)

  def _megatron_specs(self, shards: int):
    """Each parameter leaf's ``PartitionSpec`` over the model axis of ``shards`` Megatron shards."""
    return deterministic.param_specs(jax.eval_shape(self._init_state)["params"], shards)

  def _init_state(self) -> dict:
    params = model_lib.init_params(self.model_config, self.key, self.config.seq_len)
    return {"params": params, "opt_state": self.optimizer.init(params)}

  def init_state(self) -> dict:
    state = self._init_state()
    return state if self.layout is None else sharding.place(state, self.state_sharding)

  def place(self, batch: np.ndarray):
    """A host batch as the train/eval steps' input: as is on one device, a global sharded array on a mesh."""
    return batch if self.layout is None else sharding.place(batch, self.batch_sharding)

  def quant_key(self, step: int) -> jax.Array:
    key = jax.random.fold_in(jax.random.fold_in(self.key, QUANT_KEY_SALT), step)
    return key if self.layout is None else sharding.place(key, sharding.replicated(self.mesh))

  def _loss(self, params, batch, key, total_rows=None, model=None):
    """Mean loss of ``batch`` (``next_token_loss``; with ``total_rows``, its share of a larger batch's mean)
    under ``model`` (default ``self.model``)."""
    logits = (self.model if model is None else model).apply({"params": params}, batch[:, :-1], rngs={"quant": key})
    return next_token_loss(logits, batch[:, 1:], total_rows)

  def _train_step(self, state, batch, key):
    loss, grads = self.value_and_grad(state["params"], batch, key)
    updates, opt_state = self.optimizer.update(grads, state["opt_state"], state["params"])
    new_state = {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}
    return new_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

  def _eval_key(self) -> jax.Array:
    key = jax.random.fold_in(self.key, EVAL_KEY_SALT)
    return key if self.layout is None else sharding.place(key, sharding.replicated(self.mesh))

  def _losses_of(self, params, batches) -> list[float]:
    key = self._eval_key()
    return [float(self.eval_loss(params, self.place(batch), key)) for batch in batches]

  def validation_loss(self, params) -> float:
    """Mean loss over the fixed validation set, with a fixed "quant" key."""
    return float(np.mean(self._losses_of(params, self.eval_set)))

  def batch_losses(self, params, n_batches: int) -> list[float]:
    """The loss of each of ``n_batches`` fixed validation batches (``data.eval_batches``: evenly spaced windows of
    the validation split), with the fixed evaluation key: the per-batch losses that ``experiments.evaluate``
    pairs between recipes."""
    return self._losses_of(
      params, data.eval_batches(self.corpus.val, self.config.batch_size, self.config.seq_len, n_batches)
    )

  def bits_per_byte(self, loss: float) -> float | None:
    bpt = self.corpus.bytes_per_token
    return None if bpt is None else loss / math.log(2) / bpt


MANIFEST = "MANIFEST.sha256.json"  # in each checkpoint step folder, written once the checkpoint is complete
REJECTED = "ckpt-rejected"  # checkpoints that did not restore are moved here (never deleted)


class CheckpointError(ValueError):
  """A checkpoint (or the run file it vouches for) failed verification: the message names the file."""


class IncompleteCheckpointError(CheckpointError):
  """A checkpoint without its manifest: the run stopped before it was completely written."""


def _sha256_bytes(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _checksums(folder: Path) -> dict[str, str]:
  """sha256 of every file under ``folder`` (paths relative to it, ``/``-separated), the manifest left out."""
  return {
    p.relative_to(folder).as_posix(): data.sha256_file(p)
    for p in sorted(folder.rglob("*"))
    if p.is_file() and p.name != MANIFEST
  }


def write_atomic(path: Path, text: str) -> None:
  """Write ``text`` to ``path`` through a synced temporary file and an atomic rename."""
  tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
  with open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _all_finite(tree) -> jax.Array:
  leaves = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.stack(leaves).all()


_ALL_FINITE = jax.jit(_all_finite)


def _window_record(window: list) -> list[dict]:
  """The per-step metrics of an unfinished logging window as JSON (value and dtype: restored bit for bit)."""
  return [{k: [float(v), str(np.asarray(v).dtype)] for k, v in m.items()} for m in jax.device_get(window)]


def _window_from_record(record: list[dict]) -> list[dict]:
  return [{k: np.dtype(dtype).type(v) for k, (v, dtype) in m.items()} for m in record]


class RunFolder:
  """config.json, metrics.jsonl, summary.json and the orbax checkpoints of one run.

  Each checkpoint step folder gets a ``MANIFEST.sha256.json`` once orbax has finished writing it: the sha256 of
  every file in it, of config.json, of metrics.jsonl as it was then (its first ``metrics_bytes`` bytes: the records
  up to that step), the unfinished logging window's per-step metrics, and a sha256 of all that. A restore takes
  the newest checkpoint that verifies and moves the others aside to ``ckpt-rejected/`` (saying so); orbax keeps
  the newest 3, so at least 2 verified ones exist once 3 were written.
  """

  def __init__(self, path: str | Path, config: TrainConfig, quiet: bool = True):
    self.path = Path(path).resolve()
    self.path.mkdir(parents=True, exist_ok=True)
    self.primary = jax.process_index() == 0  # with several processes, process 0 writes config and metrics
    self.quiet = quiet
    self.config_file = self.path / "config.json"
    self.metrics = self.path / "metrics.jsonl"
    self.summary = self.path / "summary.json"
    self.checkpoints = ocp.CheckpointManager(
      self.path / "ckpt", options=ocp.CheckpointManagerOptions(max_to_keep=3, create=True)
    )
    self.window: list[dict] = []  # the restored checkpoint's unfinished logging window
    self._pending: dict | None = None  # the manifest of the checkpoint being written
    mine = dataclasses.asdict(config)
    if self.config_file.exists():
      theirs = {**dataclasses.asdict(TrainConfig()), **self._read_config()}  # new fields take their default
      if theirs != mine:
        diff = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        raise ValueError(
          f"out={str(self.path)!r} holds a run with a different config (fields {diff}); "
          "use another --out or the same arguments to resume"
        )
    elif self.primary:
      write_atomic(self.config_file, json.dumps(mine, indent=1) + "\n")

  def step_dir(self, step: int) -> Path:
    return self.path / "ckpt" / str(step)

  def _read_config(self) -> dict:
    raw = self.config_file.read_bytes()
    for step in sorted(self.checkpoints.all_steps(), reverse=True):
      try:
        recorded = self._manifest(step)["config_sha256"]
      except CheckpointError:
        continue
      if _sha256_bytes(raw) != recorded:
        raise CheckpointError(
          f"{self.config_file}: sha256 {_sha256_bytes(raw)} is not the {recorded} "
          f"recorded with checkpoint {step} ({self.step_dir(step) / MANIFEST}): the file "
          "was corrupted or edited"
        )
      break
    try:
      return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
      raise CheckpointError(
        f"{self.config_file} is not valid JSON ({err}): corrupted; expected the run's TrainConfig"
      ) from None

  def _manifest(self, step: int) -> dict:
    """The verified body of checkpoint ``step``'s manifest."""
    path = self.step_dir(step) / MANIFEST
    if not path.exists():
      raise IncompleteCheckpointError(
        f"{path} is missing: the checkpoint was not completed (the run stopped while writing it)"
      )
    try:
      manifest = json.loads(path.read_bytes())
      body, digest = manifest["body"], manifest["sha256"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
      raise CheckpointError(f"{path} is not a valid manifest ({err!r}): corrupted") from None
    if _sha256_bytes(json.dumps(body, sort_keys=True).encode()) != digest:
      raise CheckpointError(f"{path}: its contents do not match its sha256: corrupted")
    return body

  def _verified_metrics(self, step: int, body: dict) -> bytes:
    """The metrics.jsonl records of the steps up to ``step``, checked against the manifest."""
    if not self.primary:
      return b""
    raw = self.metrics.read_bytes() if self.metrics.exists() else b""
    kept = raw[: body["metrics_bytes"]]
    if _sha256_bytes(kept) != body["metrics_sha256"]:
      raise CheckpointError(
        f"{self.metrics}: its first {body['metrics_bytes']} bytes (the records up to step "
        f"{step}) do not match the sha256 recorded with checkpoint {step}: truncated or "
        "corrupted"
      )
    tail = raw[body["metrics_bytes"] :]
    if tail and not tail.endswith(b"\n"):
      self._say(f"warning: {self.metrics}: dropped a cut-off last line (the run stopped while writing it)")
    return kept

  def _verify(self, step: int) -> dict:
    body = self._manifest(step)
    folder = self.step_dir(step)
    actual = _checksums(folder)
    for name in sorted(body["files"].keys() | actual.keys()):
      if name not in actual:
        raise CheckpointError(f"{folder / name} is missing (listed in {folder / MANIFEST})")
      if name not in body["files"]:
        raise CheckpointError(f"{folder / name} is not listed in {folder / MANIFEST}")
      if actual[name] != body["files"][name]:
        raise CheckpointError(
          f"{folder / name}: sha256 {actual[name]} does not match the manifest's {body['files'][name]}: corrupted"
        )
    return body

  def _reject(self, step: int) -> Path:
    target = self.path / REJECTED / str(step)
    for i in range(1, 1_000_000):
      if not target.exists():
        break
      target = self.path / REJECTED / f"{step}.{i}"
    if self.primary:
      target.parent.mkdir(exist_ok=True)
      os.replace(self.step_dir(step), target)
    self.checkpoints.reload()
    return target

  def _say(self, message: str) -> None:
    if self.primary:
      print(message, file=sys.stderr, flush=True)

  def restore(self, template: dict) -> tuple[dict, int]:
    """The newest checkpoint that verifies (state, step), and the metrics truncated to it; (template, 0) if none.

    Checkpoints that do not verify are moved to ``ckpt-rejected/``, each with a message naming the file.

    Raises:
        CheckpointError: checkpoints exist, with manifests, but none verifies (the messages name the files).
    """
    failures = []
    for step in sorted(self.checkpoints.all_steps(), reverse=True):
      try:
        body = self._verify(step)
        kept = self._verified_metrics(step, body)
        if body["config_sha256"] != _sha256_bytes(self.config_file.read_bytes()):
          raise CheckpointError(f"{self.config_file} is not the config.json of checkpoint {step}")
      except CheckpointError as err:
        failures.append((step, err))
        target = self._reject(step)
        self._say(
          f"checkpoint {step} does not restore: {err}; moved it to {target}"
          + (", falling back to the previous one" if self.checkpoints.all_steps() else "")
        )
        continue
      state = self.checkpoints.restore(step, args=ocp.args.StandardRestore(template))
      if not bool(_ALL_FINITE(state)):
        raise CheckpointError(f"checkpoint {step} ({self.step_dir(step)}) holds non-finite values")
      if self.primary:
        write_atomic(self.metrics, kept.decode())
      self.window = _window_from_record(body["window"])
      if not self.quiet:
        self._say(f"resuming from step {step} (checkpoint {self.step_dir(step)})")
      return state, step
    if any(not isinstance(err, IncompleteCheckpointError) for _, err in failures):
      raise CheckpointError(
        "no checkpoint of " + str(self.path) + " restores:\n" + "\n".join(f"  step {s}: {e}" for s, e in failures)
      )
    if self.primary and self.metrics.exists():
      if failures:
        os.replace(self.metrics, self.path / REJECTED / f"metrics.{os.getpid()}.jsonl")
        self._say(f"no complete checkpoint: starting from step 0 (the old metrics are in {self.path / REJECTED})")
      else:
        self.metrics.unlink()
    return template, 0

  def save(self, step: int, state: dict, window: list) -> None:
    """Checkpoint ``state`` at ``step`` (asynchronously; its manifest follows once written: :meth:`poll`).

    ``window``: the per-step metrics of the unfinished logging window (empty at a logging boundary)."""
    self._finish_pending(wait=True)
    raw = self.metrics.read_bytes() if self.primary and self.metrics.exists() else b""
    self._pending = {
      "step": step,
      "config_sha256": _sha256_bytes(self.config_file.read_bytes()),
      "metrics_bytes": len(raw),
      "metrics_sha256": _sha256_bytes(raw),
      "window": _window_record(window),
    }
    self.checkpoints.save(step, args=ocp.args.StandardSave(state))

  def poll(self) -> None:
    """Write the manifest of the checkpoint being saved if orbax has finished it."""
    self._finish_pending(wait=False)

  def _finish_pending(self, wait: bool) -> None:
    if self._pending is None or (not wait and self.checkpoints.is_saving_in_progress()):
      return
    self.checkpoints.wait_until_finished()
    body = {**self._pending, "files": _checksums(self.step_dir(self._pending["step"]))}
    self._pending = None
    if self.primary:
      manifest = {"body": body, "sha256": _sha256_bytes(json.dumps(body, sort_keys=True).encode())}
      write_atomic(self.step_dir(body["step"]) / MANIFEST, json.dumps(manifest, indent=1) + "\n")

  def log(self, record: dict) -> None:
    if not self.primary:
      return
    with open(self.metrics, "a") as f:
      f.write(json.dumps(record) + "\n")

  def close(self) -> None:
    self._finish_pending(wait=True)
    self.checkpoints.close()


def source_commit() -> str | None:
  """The commit of the code that runs: $FP4JAX_COMMIT, else the checkout's ``git rev-parse --short HEAD`` with
  ``-dirty`` when tracked files differ from it (so a copied tree under a stale ``.git`` says so), else None."""
  commit = os.environ.get("FP4JAX_COMMIT") or None
  if commit is None:
    git = ["git", "-C", str(data.REPO_ROOT)]
    try:
      head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
      dirty = subprocess.run([*git, "status", "--porcelain", "-uno"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
      head = dirty = None
    if head is not None and head.returncode == 0 and dirty.returncode == 0:
      commit = head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
  return commit


def provenance() -> dict:
  """Where and on what code a run's numbers were made, for its summary: ``commit`` (``source_commit()``),
  ``device`` (the first JAX device's kind), ``jax_version`` and ``date`` (UTC, ISO 8601, to the second)."""
  return {
    "commit": source_commit(),
    "device": jax.devices()[0].device_kind,
    "jax_version": jax.__version__,
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  }


def record_seed(record: dict) -> int:
  """The training seed of an evaluation record or run summary (those written before seeds were recorded: 0, the
  default every such run used)."""
  return record.get("seed", 0)


def recipe_label(config: TrainConfig) -> str:
  """The recipe a run's records name: ``config.recipe``, or under ``causal_amax`` the name
  ``fp4jax.recipes.causal`` gives it (``"<recipe>:causal"``), so that a per-token-amax run is never counted as a
  seed of the per-tensor one."""
  return f"{config.recipe}:causal" if config.causal_amax else config.recipe


def evaluation_record(name: str, config: TrainConfig, step: int, batch_losses: list[float]) -> dict:
  """The per-batch validation losses of run ``name`` at ``step``, as ``experiments.evaluate`` pairs them."""
  return {
    "name": name,
    "model": config.model,
    "recipe": recipe_label(config),
    "tokens": config.tokens,
    "seed": config.seed,
    "step": step,
    "steps": config.steps,
    "batch_losses": batch_losses,
  }


def read_metrics(path: str | Path, kind: str | None = None) -> list[dict]:
  """Records of a run folder's metrics.jsonl (all, or only those of ``kind``)."""
  lines = (Path(path) / "metrics.jsonl").read_text().splitlines()
  return [r for r in map(json.loads, lines) if kind is None or r["kind"] == kind]


class StopSignals:
  """SIGINT / SIGTERM set ``received`` (the training loop then checkpoints and stops); a second signal of the same
  kind acts as it normally does. A context manager: the previous handlers come back on exit (main thread only;
  elsewhere signals are left alone)."""

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self):
    self.received: int | None = None
    self._previous: dict = {}

  def _handle(self, signum, frame):
    self.received = signum
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def __enter__(self) -> Self:
    if threading.current_thread() is threading.main_thread():
      self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def _first_non_finite(window: list[dict]) -> int | None:
  """Index of the first step of ``window`` (fetched metrics) whose loss or gradient norm is not finite."""
  return next((i for i, m in enumerate(window) if not (np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"]))), None)


def train(
  config: TrainConfig,
  out: str | Path,
  cache_dir: str | None = None,
  max_minutes: float | None = None,
  stop_at_step: int | None = None,
  quiet: bool = False,
  layout: sharding.Layout | None = None,
  model_overrides: dict | None = None,
  final_eval_batches: int = 0,
) -> dict:
  """Train (or resume) the run in ``out``; return its summary ({"status": "finished" | "paused" | "interrupted" |
  "diverged", ...}).

  ``max_minutes`` and ``stop_at_step`` pause at the first logging boundary where the time budget would run out /
  the step is reached; rerunning resumes. SIGINT / SIGTERM checkpoint the current step and stop ("interrupted";
  rerunning resumes, the same curve bit for bit). A non-finite loss or gradient norm (checked at each logging
  boundary) or state (checked before each checkpoint) stops the run ("diverged") without checkpointing it: the
  newest checkpoint stays the last finite one. ``model_overrides``: ModelConfig fields that change how, not what,
  the model computes (e.g. ``{"remat": True}``); like the layout they are not part of config.json.
  ``final_eval_batches``: when the run finishes, write the loss of each of that many validation batches to
  ``out/final_eval.json`` (:data:`FINAL_EVAL`, the record ``experiments.evaluate`` writes), while the weights
  are still on the device.

  Raises:
      CheckpointError: the run folder's checkpoints exist but none verifies, or config.json was corrupted.
  """
  if final_eval_batches < 0:
    raise ValueError(f"final_eval_batches must be >= 0, got {final_eval_batches}")
  with StopSignals() as signals:
    return _train(
      config, out, cache_dir, max_minutes, stop_at_step, quiet, layout, model_overrides, final_eval_batches, signals
    )


def _train(
  config,
  out,
  cache_dir,
  max_minutes,
  stop_at_step,
  quiet,
  layout,
  model_overrides,
  final_eval_batches,
  signals: StopSignals,
) -> dict:
  started = time.perf_counter()
  trainer = Trainer(config, cache_dir, layout, model_overrides)
  folder = RunFolder(out, config, quiet=quiet)
  state, step = folder.restore(trainer.init_state())
  if folder.primary:
    folder.summary.unlink(missing_ok=True)  # of an earlier piece; rewritten when this one ends
  counts = model_lib.parameter_count(trainer.model_config)

  def emit(record):
    folder.log({"step": step, "tokens": step * config.tokens_per_step, **record})

  def log_validation():
    loss = trainer.validation_loss(state["params"])
    emit({"kind": "val", "val_loss": loss, "val_bpb": trainer.bits_per_byte(loss)})
    return loss

  def diverged(at: int, what: str) -> str:
    last_ckpt = folder.checkpoints.latest_step()
    kept = f"checkpoint {last_ckpt} ({folder.step_dir(last_ckpt)})" if last_ckpt is not None else "no checkpoint"
    print(
      f"diverged at step {at}: {what}; not checkpointed, the last finite state is {kept}", file=sys.stderr, flush=True
    )
    return "diverged"

  if step == 0:
    log_validation()
  resumed_from, window_losses, window_start, next_window_s = step, list(folder.window), time.perf_counter(), 0.0
  status, last, timed_steps, eta, window_compiled = "finished", {}, 0, cli.Eta(), False
  progress = None if quiet else cli.Progress(config.steps, step, f"{config.recipe} {config.model}")
  while step < config.steps and signals.received is None:
    batch = trainer.place(trainer.stream.batch(step))
    first = step == resumed_from
    if first and progress is not None:
      progress.write(f"compiling the train step for {config.recipe} ...")
      compile_start = time.perf_counter()
    state, out_metrics = trainer.train_step(state, batch, trainer.quant_key(step))
    window_losses.append(out_metrics)
    step += 1
    if first:
      jax.block_until_ready(out_metrics)
      if progress is not None:
        progress.write(f"compiled in {time.perf_counter() - compile_start:.1f} s (its first step included)")
    if first and step % config.log_every and step < config.steps:
      # The first step after a (re)start compiles: time the steps after it, or its compile time would pass
      # for the step time (the tokens/s logged and the pause estimate of the next window).
      window_start = time.perf_counter()
    else:
      timed_steps += 1
      window_compiled |= first  # a window holding the compiling step: not for the ETA
    boundary = step % config.log_every == 0 or step == config.steps
    if boundary:
      fetched = jax.device_get(window_losses)
      now = time.perf_counter()
      step_time = (now - window_start) / max(timed_steps, 1)
      next_window_s = step_time * config.log_every
      if not window_compiled:
        eta.add(now - window_start, timed_steps)
      last = {
        "loss": float(np.mean([m["loss"] for m in fetched])),
        "grad_norm": float(fetched[-1]["grad_norm"]),
        "lr": float(trainer.schedule(step - 1)),
        "step_time_s": step_time,
        "tokens_per_s": config.tokens_per_step / step_time,
      }
      emit({"kind": "train", **last})
      window_losses, window_start, timed_steps, window_compiled = [], now, 0, False
      if (bad := _first_non_finite(fetched)) is not None:
        at = step - len(fetched) + 1 + bad
        status = diverged(at, f"loss {fetched[bad]['loss']}, gradient norm {fetched[bad]['grad_norm']}")
        break
      folder.poll()
    if step % config.eval_every == 0 or step == config.steps:
      last["val_loss"] = log_validation()
    if config.quant_error_every and step % config.quant_error_every == 0:
      errors = diagnostics.projection_quant_errors(
        trainer.model, state["params"], trainer.eval_set[0][:, :-1], trainer.quant_key(step)
      )
      if errors:
        emit({"kind": "quant_error", "relative_mse": errors})
    out_of_time = max_minutes is not None and (time.perf_counter() - started + 1.5 * next_window_s > 60 * max_minutes)
    pause = boundary and step < config.steps and (out_of_time or (stop_at_step is not None and step >= stop_at_step))
    stop = signals.received is not None
    if step % config.ckpt_every == 0 or step == config.steps or pause or stop:
      if not bool(_ALL_FINITE(state)):
        status = diverged(step, "the parameters or optimizer state after it are not finite")
        break
      folder.save(step, state, window_losses)
    if boundary and progress is not None:
      progress.update(
        step,
        f"{step * config.tokens_per_step:,} tok | loss {last['loss']:.4f} | "
        f"{last['tokens_per_s']:,.0f} tok/s | ETA {cli.duration(eta.remaining(config.steps - step))}",
      )
    if pause:
      status = "paused"
      break
    if stop:
      status = "interrupted"
      print(
        f"\n{signal.Signals(signals.received).name}: wrote the checkpoint of step {step} "
        f"({folder.step_dir(step)}); rerun the same command to resume",
        file=sys.stderr,
        flush=True,
      )
  if signals.received is not None and status == "finished" and step < config.steps:
    status = "interrupted"  # before the first step: nothing new to checkpoint
    print(
      f"\n{signal.Signals(signals.received).name} before the first step: nothing to checkpoint; rerun the "
      "same command to resume",
      file=sys.stderr,
      flush=True,
    )
  folder.close()
  if progress is not None:
    progress.close()
  train_records = read_metrics(folder.path, "train")
  val_records = read_metrics(folder.path, "val")
  summary = {
    "status": status,
    "step": step,
    "steps": config.steps,
    "tokens": step * config.tokens_per_step,
    "model": config.model,
    "recipe": recipe_label(config),
    "seed": config.seed,
    "bf16_first": config.bf16_first,
    "bf16_last": config.bf16_last,
    "params": counts["total"],
    "non_embedding_params": counts["non_embedding"],
    "train_loss": train_records[-1]["loss"] if train_records else None,
    "val_loss": val_records[-1]["val_loss"],
    "val_bpb": val_records[-1]["val_bpb"],
    "tokens_per_s": float(np.median([r["tokens_per_s"] for r in train_records])) if train_records else None,
    "wall_s": time.perf_counter() - started,
    "mesh": "1 device" if layout is None else layout.describe(),  # of the last piece (a run may resume elsewhere)
    **provenance(),  # likewise of the last piece
  }
  if status == "interrupted":
    summary["signal"] = signal.Signals(signals.received).name
  if status == "finished" and final_eval_batches:
    record = evaluation_record(
      folder.path.name, config, step, trainer.batch_losses(state["params"], final_eval_batches)
    )
    if folder.primary:
      write_atomic(folder.path / FINAL_EVAL, json.dumps(record) + "\n")
  if status != "paused" and folder.primary:
    write_atomic(folder.summary, json.dumps(summary, indent=1) + "\n")
  if not quiet:
    print(
      f"{status}: recipe={config.recipe} model={config.model} step={step}/{config.steps} "
      f"tokens={summary['tokens']:,} val_loss={summary['val_loss']:.4f} "
      + (f"val_bpb={summary['val_bpb']:.4f} " if summary["val_bpb"] is not None else "")
      + f"tok/s={summary['tokens_per_s'] or 0:,.0f} wall={cli.duration(summary['wall_s'])} out={folder.path}"
    )
  return summary


_INT_FLAGS = {
  "batch_size": "sequences per step (global, over all devices)",
  "seq_len": "tokens per sequence",
  "seed": "seed of the initialization, the data order and the quantizers' random bits",
  "bf16_first": "blocks at the input kept in bf16 (not quantized)",
  "bf16_last": "blocks at the output kept in bf16 (not quantized)",
  "log_every": "steps per logged training-loss window (and per progress line)",
  "eval_every": "steps between validation losses",
  "eval_batches": "validation batches per validation loss",
  "ckpt_every": "steps between checkpoints (a multiple of --log-every)",
  "quant_error_every": "steps between logged quantization errors of the projections; 0: never",
}
_FLOAT_FLAGS = {
  "lr": ("positive", "peak learning rate (default: the model size's, model.SIZES)"),
  "warmup_frac": ("fraction", "fraction of the steps that warm the learning rate up linearly"),
  "weight_decay": ("non_negative", "AdamW weight decay"),
  "clip_norm": ("positive", "global gradient-norm clip"),
}


def positive_int(text: str) -> int:
  """argparse type: an integer >= 1."""
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
  return value


def add_config_arguments(parser: argparse.ArgumentParser, steps: bool = False) -> None:
  """One ``--flag`` per TrainConfig field (shared with the sweep and compare commands); with ``steps``, a
  ``--steps`` flag excluding ``--tokens`` (:func:`config_from_args` turns it into tokens)."""
  defaults = TrainConfig()
  parser.add_argument("--model", default=defaults.model, choices=list(model_lib.SIZES), help="model size")
  parser.add_argument(
    "--recipe",
    default=defaults.recipe,
    help="bf16, an fp4jax recipe name (e.g. quartet2), or module:attr naming a recipe of one's own "
    "(fp4jax.recipes.compose; see model.resolve_recipe)",
  )
  length = parser.add_mutually_exclusive_group() if steps else parser
  length.add_argument("--tokens", type=parse_count, default=defaults.tokens, help="training tokens, e.g. 200M")
  if steps:
    length.add_argument(
      "--steps",
      type=positive_int,
      default=None,
      help="training steps instead of --tokens: tokens = steps x batch size x sequence length",
    )
  parser.add_argument("--data", default=defaults.data, help="stdlib | linux | corpus folder | train .bin[.xz]")
  for name, text in _INT_FLAGS.items():
    parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name), help=text)
  for name, (kind, text) in _FLOAT_FLAGS.items():
    flag = "--" + name.replace("_", "-")
    parser.add_argument(flag, type=finite_float(kind), default=getattr(defaults, name), help=text)
  parser.add_argument(
    "--dtype",
    default=defaults.dtype,
    choices=["bfloat16", "float32"],
    help="activation and compute dtype (parameters stay float32)",
  )
  parser.add_argument(
    "--attention-impl",
    default=None,
    choices=["auto", "xla", "cudnn"],
    help="jax.nn.dot_product_attention implementation; default (None) auto: cuDNN flash attention on a GPU, XLA's "
    "on a CPU and with --deterministic",
  )
  parser.add_argument(
    "--token-dtype",
    default=None,
    choices=["uint8", "uint16", "uint32"],
    help="dtype of the token files of a corpus folder without meta.json",
  )
  parser.add_argument(
    "--grad-comm-dtype",
    default=defaults.grad_comm_dtype,
    choices=list(sharding.GRAD_COMM_DTYPES),
    help="dtype of the data-parallel gradient all-reduce (bfloat16 / float8_e4m3fn: --mesh data=N, with or "
    "without --fsdp)",
  )
  parser.add_argument(
    "--deterministic",
    type=int,
    default=defaults.deterministic,
    metavar="R",
    help="R fixed microbatches (a power of two) summed in a fixed order: the same loss curve bit "
    "for bit on one device and on any --mesh data=D (D | R), with or without --fsdp",
  )
  parser.add_argument(
    "--tensor-shards",
    type=int,
    default=defaults.tensor_shards,
    metavar="T",
    help="with --deterministic: the blocks as T Megatron tensor-parallel shards (a power of two), "
    "the same bits on --mesh model=T or data=D,model=T as on one device or --mesh data=D",
  )
  parser.add_argument(
    "--causal-amax",
    action="store_true",
    help="fp4jax.recipes.causal(recipe): amax of the projections' inputs per token, not per "
    "tensor, so no token's quantization depends on later tokens or other batch rows",
  )


def add_execution_arguments(parser: argparse.ArgumentParser) -> None:
  """The flags of how (not what) a run computes: ModelConfig fields outside config.json (see :func:`train`)."""
  parser.add_argument("--remat", action="store_true", help="recompute block activations in the backward pass")
  parser.add_argument(
    "--scan-unroll",
    type=parse_scan_unroll,
    default="auto",
    help="blocks per scan iteration (>= the layer count: no device loop, faster steps, longer compiles), or auto: "
    "BF16 blocks unrolled, and nvidia_nvfp4's where the GPU kernels quantize; other FP4 blocks one per iteration",
  )
  parser.add_argument(
    "--threefry-kernel",
    default="auto",
    choices=list(THREEFRY_KERNEL),
    help="lower the steps under jax_threefry_gpu_kernel_lowering (a GPU's threefry PRNG calls as kernels, not their "
    "rounds in the HLO: the same bits, shorter compiles, a launch per call): on, off, or auto: where FP4 blocks are "
    "unrolled",
  )
  parser.add_argument(
    "--recompute",
    default="auto",
    choices=list(get_args(model_lib.Recompute)),
    help="elementwise parts the backward pass recomputes from their bf16 inputs instead of saving: none, norms "
    "(RMSNorm), norms_swiglu (and the SwiGLU product; less memory traffic), or auto: norms_swiglu in FP4 blocks, "
    "none in BF16 blocks",
  )
  parser.add_argument(
    "--prequantize-weights",
    action=argparse.BooleanOptionalAction,
    default=True,
    help="FP4 blocks quantize their projection weights for all layers before the layer loop, where the recipe's "
    "weights need no random bits (every published recipe); --no-prequantize-weights: each layer in the loop (the "
    "same bits, a slower step)",
  )
  parser.add_argument(
    "--quantizer-backend",
    default="auto",
    choices=list(model_lib.QUANTIZER_BACKENDS),
    help="the FP4 quantizers: auto (the fused kernels on a GPU that runs them, XLA on a CPU), xla, or pallas "
    "(same bits; one device, a data-parallel mesh, or any mesh with --deterministic)",
  )


# --threefry-kernel's values: ModelConfig.threefry_kernel's
THREEFRY_KERNEL = {"auto": "auto", "on": True, "off": False}


def parse_scan_unroll(text: str) -> int | str:
  """--scan-unroll's value: "auto" or a positive int."""
  if text == "auto":
    return text
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value <= 0:
    raise argparse.ArgumentTypeError(f"expected 'auto' or a positive integer, got {text!r}")
  return value


def execution_overrides(args: argparse.Namespace) -> dict:
  """The ``model_overrides`` of :func:`add_execution_arguments`' flags."""
  return {
    "remat": args.remat,
    "scan_unroll": args.scan_unroll,
    "threefry_kernel": THREEFRY_KERNEL[args.threefry_kernel],
    "recompute": args.recompute,
    "quantizer_backend": args.quantizer_backend,
    "prequantize_weights": args.prequantize_weights,
  }


def execution_to_args(overrides: dict) -> list[str]:
  """The flags that :func:`execution_overrides` turns back into ``overrides``."""
  remat = ["--remat"] if overrides.get("remat") else []
  return remat + [
    "--prequantize-weights" if overrides.get("prequantize_weights", True) else "--no-prequantize-weights",
    "--scan-unroll",
    str(overrides.get("scan_unroll", "auto")),
    "--threefry-kernel",
    next(k for k, v in THREEFRY_KERNEL.items() if v == overrides.get("threefry_kernel", "auto")),
    "--recompute",
    overrides.get("recompute", "auto"),
    "--quantizer-backend",
    overrides.get("quantizer_backend", "auto"),
  ]


def config_from_args(args: argparse.Namespace) -> TrainConfig:
  """The TrainConfig of parsed flags; ``--steps N`` (if the parser has it) sets tokens to N x batch x seq_len."""
  fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)}
  if getattr(args, "steps", None) is not None:
    fields["tokens"] = args.steps * args.batch_size * args.seq_len
  return TrainConfig(**fields)


def config_to_args(config: TrainConfig) -> list[str]:
  """The command-line flags that :func:`config_from_args` turns back into ``config``."""
  flags = []
  for field in dataclasses.fields(TrainConfig):
    value = getattr(config, field.name)
    if isinstance(value, bool):
      flags += ["--" + field.name.replace("_", "-")] if value else []
    elif value is not None:
      flags += ["--" + field.name.replace("_", "-"), repr(value) if isinstance(value, float) else str(value)]
  return flags


def build_parser() -> argparse.ArgumentParser:
  """fp4jax-train's command line."""
  parser = cli.parser("fp4jax-train", __doc__.split("\n\n")[0])
  add_config_arguments(parser, steps=True)
  parser.add_argument("--out", default=None, help="run folder (default runs/<model>-<recipe>-<tokens>)")
  parser.add_argument("--cache-dir", default=None, help="corpus cache (default $FP4JAX_CACHE or ~/.cache/fp4jax)")
  parser.add_argument(
    "--max-minutes",
    type=finite_float("positive"),
    default=None,
    help="pause (checkpoint and exit) before this many minutes have passed (default: no limit); rerun to resume",
  )
  parser.add_argument("--mesh", default=None, help="device mesh, e.g. data=4 or data=2,model=2 (default: 1 device)")
  parser.add_argument("--fsdp", action="store_true", help="shard parameters and optimizer state over the data axis")
  add_execution_arguments(parser)
  parser.add_argument(
    "--final-eval-batches",
    type=int,
    default=0,
    help="when finished, write this many validation batches' losses to OUT/final_eval.json",
  )
  parser.add_argument("--distributed", action="store_true", help="multi-host: call jax.distributed.initialize")
  parser.add_argument("--coordinator", default=None, help="with --distributed: process 0's host:port")
  parser.add_argument("--num-processes", type=int, default=None, help="with --distributed: number of processes")
  parser.add_argument("--process-id", type=int, default=None, help="with --distributed: this process's index")
  return parser


def main(argv: list[str] | None = None) -> None:
  parser = build_parser()
  args = parser.parse_args(argv)
  try:
    config = config_from_args(args)
    model_lib.projection_dot_cls(config.recipe)  # an unknown name or a module:attr that does not load
  except ValueError as err:
    parser.error(str(err))
  out = args.out or f"runs/{config.model}-{config.recipe}-{config.tokens}"
  if config.deterministic:
    deterministic.set_gpu_flags()
  layout = None
  if args.distributed:
    sharding.initialize_distributed(args.coordinator, args.num_processes, args.process_id)
  if args.mesh is not None:
    try:
      layout = sharding.parse_mesh(args.mesh, fsdp=args.fsdp)
    except ValueError as err:
      parser.error(str(err))
  elif args.fsdp:
    parser.error("--fsdp needs --mesh data=N")
  try:
    sharding.check_grad_comm(config.grad_comm_dtype, layout)
  except ValueError as err:
    parser.error(str(err))
  try:
    shape = model_lib.model_config(
      config.model, recipe=config.recipe, bf16_first=config.bf16_first, bf16_last=config.bf16_last
    )
    args.quantizer_backend = quantizer_backend_for(args.quantizer_backend, layout, config, shape)
  except ValueError as err:
    parser.error(f"--quantizer-backend: {err}")
  if args.quantizer_backend == "pallas" and config.tensor_shards > 1:
    parser.error(
      "--quantizer-backend pallas: with --tensor-shards the operands split over the shards are "
      "quantized by XLA (cross-shard amax); use auto (the kernels for the others)"
    )
  summary = train(
    config,
    out,
    cache_dir=args.cache_dir,
    max_minutes=args.max_minutes,
    layout=layout,
    model_overrides=execution_overrides(args),
    final_eval_batches=args.final_eval_batches,
  )
  sys.exit(exit_code(summary))


def exit_code(summary: dict) -> int:
  """0 for a finished or paused run, 1 for a diverged one, 128 + the signal's number for an interrupted one."""
  if summary["status"] == "interrupted":
    return 128 + signal.Signals[summary["signal"]].value
  return 1 if summary["status"] == "diverged" else 0


if __name__ == "__main__":
  main()
