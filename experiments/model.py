"""Llama-style decoder-only language model in Flax linen, with FP4 projections chosen per layer by recipe name.

Architecture (the Quartet / Quartet II training setup, FP4-REFERENCE.md §4), no biases anywhere:
  h_0     = Embed(tokens)                                       (untied from the LM head)
  h'_l    = h_l  + Attn_l(RMSNorm(h_l))                         (pre-norm residual blocks)
  h_{l+1} = h'_l + SwiGLU_l(RMSNorm(h'_l))
  logits  = LMHead(RMSNorm(h_L))
  RMSNorm(x) = g ⊙ x / sqrt(mean(x²) + ε)                       (computed in fp32)
  Attn(x)    = o( softmax(RoPE(q(x)) RoPE(k(x))ᵀ / sqrt(d_head) + causal mask) v(x) )
  SwiGLU(x)  = down( silu(gate(x)) ⊙ up(x) ),  hidden = m·ceil(8d/3/m)   (m = 256; 64 for the tiny CPU sizes)
Initialization: every weight ~ N(0, 0.02²), the residual outputs o and down ~ N(0, (0.02/sqrt(2L))²) (GPT-2
scaling); RMSNorm gains 1.

Precision: parameters fp32 (master weights); activations and GEMM inputs bf16 (``dtype``). Only the seven projections
of each block (q, k, v, o, gate, up, down) take the recipe's dot; embeddings, the LM head, the attention products and
the norms stay high precision. ``bf16_first`` / ``bf16_last`` keep that many blocks at each end in BF16 (NVIDIA's
NVFP4 policy, arXiv 2509.25149).

Mixture of experts (``num_experts`` E > 0): each block's SwiGLU is replaced by ``fp4jax.flax.linen.MoE`` (a float32
top-k router, E SwiGLU experts of width ``expert_hidden`` whose two grouped GEMMs run ``fp4jax.ragged_dot`` under the
block's recipe, BF16 blocks included; no load-balancing loss):
  MoE(x)_t = Σ_j p_tj · down_e(silu(gate_e(x_t)) ⊙ up_e(x_t)),  e = e_tj, the top_k experts of token t
  p_t·     = the top_k largest of softmax(router(x_t)) (fp32), renormalized to sum to 1
Its parameters ``mlp/router/kernel`` (d, E), ``mlp/w_in`` (E, d, 2·expert_hidden) = [gate | up] and ``mlp/w_out``
(E, expert_hidden, d) are stacked per layer like the rest; w_in ~ N(0, 0.02²), w_out ~ the residual outputs'
N(0, (0.02/sqrt(2L))²), the router as ``MoE`` initializes it (flax's LeCun normal, variance 1/d).

Layout: the blocks run under ``nn.scan`` in up to three stacks that follow that policy, not the recipe
(``layer_stacks``: ``first_blocks``, ``blocks``, ``last_blocks``); every parameter of a stack has a leading layer
axis (``params["blocks"]["attn"]["q"]["kernel"]`` is (layers, d, d)) and the "params" and "quant" RNG streams are
split per layer. ``remat=True`` recomputes each block's activations in the backward pass; ``scan_unroll=k`` traces
k blocks per loop iteration. A device loop over the blocks copies every block's saved activations into (and out of)
the stacked buffers of the backward pass; unrolled, the blocks are straight-line code without those copies, but
XLA then compiles every block's kernels apart, and an FP4 block has many more kernels than a BF16 block (its
quantizers' fusions beside the Pallas kernels). ``scan_unroll="auto"`` (the default) unrolls the BF16 stacks whole,
and the stacks of the FP4 recipes in :data:`UNROLLED_RECIPES` where the GPU kernels quantize (dense models; with
XLA's quantizers an unrolled FP4 stack compiles longer:
benchmarks/results/compile_profile_nvidia_nvfp4_cpu_unroll.json), and runs the other FP4 stacks one block per
iteration (``ModelConfig.stack_unroll``).

``threefry_kernel`` (how, not what): on a GPU, JAX lowers each threefry PRNG call (Flax's ``make_rng``, fp4jax's
key derivations and SR seeds: hundreds per FP4 step) as its 20 rounds unrolled in the HLO, most of an FP4 step's
operations; ``jax_threefry_gpu_kernel_lowering`` makes each call one kernel (the same bits), which shortens the
compile and adds a launch per call. ``"auto"`` (the default) turns it on where an FP4 stack is unrolled
(``ModelConfig.jax_config``; the Trainer lowers its steps under it).

``recompute`` (how, not what): the backward pass recomputes each RMSNorm (``"norms"``), and also the SwiGLU product
``silu(gate) ⊙ up`` of a dense block (``"norms_swiglu"``), from their bf16 inputs instead of saving their
intermediates (per block six float32 activations of the norms, three bf16 of the SiLU): fewer activations written,
and copied through a layer loop's stacked buffers. The forward values are the same bits; the gradients differ in
last bits where XLA fuses the recomputation differently (on a GPU it can also keep in float32 what the saved bf16
intermediates rounded). ``"auto"`` (the default) recomputes both in the FP4 blocks (a layer loop zero-fills,
writes and reads back a stacked buffer for every saved activation; the unrolled FP4 stacks were measured with it),
and nothing in the BF16 blocks or the final norm: a BF16 model computes the same program as with ``"none"``.

``prequantize_weights`` (how, not what; on by default): each FP4 stack quantizes its seven projection weights for all
of its layers before the layer loop (``fp4jax.prequantize_weight`` under ``jax.vmap``, one batched quantizer per
weight kind instead of one per layer) and the loop reads each layer's slice; the same bits, where
``fp4jax.prequantize_refusal`` accepts the recipe (weights quantized without random bits: every published recipe);
elsewhere (and with tensor parallelism or experts) the projections quantize their weights in the loop, as with
``prequantize_weights=False``. The loss and gradients are the same bits either way in the tests (the CPU, and a GPU
with the kernels on); a 125M step on a GPU is not reproducible run to run by default (one compiled step gives
different losses from its second step on; ``benchmarks/step_bits.py``), so losses there agree only within that noise.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
from collections.abc import Callable
from typing import Any, Literal, get_args

import flax.linen as nn
import jax
import jax.numpy as jnp

import fp4jax
import fp4jax.backends
import fp4jax.recipes
import fp4jax.sharding
from fp4jax import Backend
from fp4jax.flax.linen import DotGeneral, MoE

QUANTIZER_BACKENDS = get_args(Backend)  # fp4jax.dot_general's backend vocabulary

ATTENTION_IMPLS = (None, "auto", "xla", "cudnn")
BF16_RECIPE = "bf16"
# FP4 recipes whose stacks scan_unroll="auto" unrolls (dense models, the GPU kernels quantizing), under the threefry
# kernel lowering: their 125M steps measured faster unrolled than in the loop, each compiling in under 60 s on an H200
# (benchmarks/results/train_throughput_125M_threefry_nvidia_nvfp4.json, train_throughput_125M_variants.json).
# ms_fp4's quantizers are all XLA code, so unrolled its program is 9x its loop's
# (benchmarks/results/hlo_census_125M.json).
UNROLLED_RECIPES = frozenset({"nvidia_nvfp4", "quartet", "quartet2"})
INIT_STD = 0.02


@dataclasses.dataclass(frozen=True)
class ModelSize:
  """One row of the size table: shape, the Quartet learning rate, and the SwiGLU hidden-width multiple."""

  n_layers: int
  d_model: int
  n_heads: int
  lr: float
  ffn_multiple: int = 256
  num_experts: int = 0  # > 0: an MoE size (ModelConfig.num_experts)
  top_k: int = 2
  expert_hidden: int = 0


# Names count non-embedding parameters (the Quartet convention), except 125M / 350M: those are the GPT-2/GPT-3
# benchmark shapes (12 x 768, 24 x 1024) named as in those papers, whose counts include a 50k-token embedding.
# Every width and SwiGLU hidden size from 1M up is a multiple of 128, so quartet2's 128-point rotation applies.
SIZES: dict[str, ModelSize] = {
  "100K": ModelSize(n_layers=2, d_model=64, n_heads=1, lr=3e-3, ffn_multiple=64),  # smoke tests
  "1M": ModelSize(n_layers=4, d_model=128, n_heads=2, lr=3e-3, ffn_multiple=64),
  "3M": ModelSize(n_layers=4, d_model=256, n_heads=4, lr=2e-3, ffn_multiple=128),
  "10M": ModelSize(n_layers=6, d_model=384, n_heads=6, lr=1.5e-3, ffn_multiple=128),
  "30M": ModelSize(n_layers=6, d_model=640, n_heads=5, lr=1.2e-3),
  "50M": ModelSize(n_layers=7, d_model=768, n_heads=6, lr=1.2e-3),
  "100M": ModelSize(n_layers=8, d_model=1024, n_heads=8, lr=6e-4),
  "125M": ModelSize(n_layers=12, d_model=768, n_heads=12, lr=6e-4),
  "200M": ModelSize(n_layers=10, d_model=1280, n_heads=10, lr=3e-4),
  "350M": ModelSize(n_layers=24, d_model=1024, n_heads=16, lr=3e-4),
  # Mixture of experts, named by the total non-embedding count; a token runs through the router and top_k experts
  # only (``parameter_count``'s "active_non_embedding"): 1M-moe 1.05M total / 0.66M active (CPU tests),
  # 10M-moe 11.0M total / 3.95M active.
  "1M-moe": ModelSize(n_layers=4, d_model=128, n_heads=2, lr=3e-3, num_experts=4, top_k=2, expert_hidden=128),
  "10M-moe": ModelSize(n_layers=6, d_model=256, n_heads=4, lr=2e-3, num_experts=8, top_k=2, expert_hidden=256),
}


def size_rank(name: str) -> int:
  """Position of a model size in :data:`SIZES` (smallest first), for sorting tables; unknown names last."""
  return list(SIZES).index(name) if name in SIZES else len(SIZES)


def swiglu_hidden(d_model: int, multiple: int) -> int:
  """SwiGLU hidden width m·ceil(8d/3/m) (Llama); 8d/3 keeps the 3-matrix MLP at the 2-matrix 4d MLP's size."""
  return multiple * math.ceil(8 * d_model / 3 / multiple)


Recompute = Literal["auto", "none", "norms", "norms_swiglu"]
GradSum = Literal["per_block", "after_backward"]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape, precision policy and recipe of a model. Build from the size table with :func:`model_config`."""

  n_layers: int
  d_model: int
  n_heads: int
  ffn_hidden: int
  vocab_size: int = 256
  recipe: str = BF16_RECIPE
  bf16_first: int = 0
  bf16_last: int = 0
  rope_theta: float = 1e4
  norm_eps: float = 1e-6
  dtype: Any = jnp.bfloat16
  param_dtype: Any = jnp.float32
  # jax.nn.dot_product_attention's implementation: "xla", "cudnn" (flash attention; GPU), or "auto" / None: cuDNN
  # on a GPU for bf16/fp16 activations, else XLA (attention_implementation)
  attention_impl: str | None = "auto"
  remat: bool = False  # recompute block activations in the backward pass (less memory, ~1/3 more compute)
  # the elementwise parts the backward pass recomputes from their bf16 inputs instead of saving their intermediates:
  # "none", "norms" (RMSNorm), "norms_swiglu" (and silu(gate) ⊙ up), or "auto": "norms_swiglu" in FP4 blocks and
  # "none" in BF16 blocks (module docstring, block_recompute)
  recompute: Recompute = "auto"
  # blocks per scan iteration, or "auto": BF16 stacks and UNROLLED_RECIPES' stacks unrolled whole, other FP4 stacks
  # one block per iteration (module docstring, stack_unroll); how, not what, the model computes
  scan_unroll: int | Literal["auto"] = "auto"
  # lower the steps under jax_threefry_gpu_kernel_lowering (True/False), or "auto": where an FP4 stack is unrolled
  # (module docstring, jax_config); how, not what
  threefry_kernel: bool | Literal["auto"] = "auto"
  # a data-parallel step under shard_map (experiments.train) sums each block's parameter gradients over the devices
  # "after_backward", all at once, or "per_block", inside the backward pass's layer loop (float32 and bfloat16
  # gradients: the same sums; slower on two H100s, benchmarks/results/train_throughput_2gpu_grad_sum.json of
  # 1f5f705); how, not what; ignored elsewhere
  grad_sum: GradSum = "after_backward"
  # fp4jax.dot_general's quantizer backend for the projections: "xla", "pallas" (the fused kernels) or "auto"
  # (the kernels on a GPU that runs them); every backend gives the same bits.
  quantizer_backend: str = "auto"
  # the projections run fp4jax.recipes.causal(recipe): per-token amax of X, a strictly causal forward
  causal_amax: bool = False
  # FP4 stacks quantize their projection weights for all layers before the layer loop (module docstring); how, not
  # what
  prequantize_weights: bool = True
  # Mixture of experts: num_experts E > 0 replaces each block's SwiGLU by E SwiGLU experts of width expert_hidden
  # (0: ffn_hidden), top_k of them per token (module docstring); 0 is the dense model.
  num_experts: int = 0
  top_k: int = 2
  expert_hidden: int = 0

  def __post_init__(self):
    for name in ("n_layers", "d_model", "n_heads", "ffn_hidden", "vocab_size"):
      if getattr(self, name) <= 0:
        raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
    if self.grad_sum not in get_args(GradSum):
      raise ValueError(f"grad_sum must be one of {get_args(GradSum)}, got {self.grad_sum!r}")
    if self.recompute not in get_args(Recompute):
      raise ValueError(f"recompute must be one of {get_args(Recompute)}, got {self.recompute!r}")
    unroll = self.scan_unroll
    if unroll != "auto" and (isinstance(unroll, bool) or not (isinstance(unroll, int) and unroll > 0)):
      raise ValueError(f"scan_unroll must be 'auto' or a positive int (not a bool), got {unroll!r}")
    if not (self.threefry_kernel == "auto" or isinstance(self.threefry_kernel, bool)):
      raise ValueError(f"threefry_kernel must be 'auto', True or False, got {self.threefry_kernel!r}")
    if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
      raise ValueError(
        f"d_model={self.d_model} must split into n_heads={self.n_heads} heads of even width (RoPE rotates pairs)"
      )
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}")
    if self.quantizer_backend not in QUANTIZER_BACKENDS:
      raise ValueError(f"quantizer_backend must be one of {QUANTIZER_BACKENDS}, got {self.quantizer_backend!r}")
    if not isinstance(self.recipe, str) or not self.recipe:
      raise ValueError(f"recipe must be a non-empty recipe name, got {self.recipe!r}")
    if self.bf16_first < 0 or self.bf16_last < 0 or self.bf16_first + self.bf16_last > self.n_layers:
      raise ValueError(
        f"bf16_first={self.bf16_first} and bf16_last={self.bf16_last} must be >= 0 and sum to at most "
        f"n_layers={self.n_layers}"
      )
    self._check_experts()

  def _check_experts(self):
    if self.num_experts < 0 or self.expert_hidden < 0:
      raise ValueError(
        f"num_experts={self.num_experts} and expert_hidden={self.expert_hidden} must be >= 0 (0: dense model; "
        "expert_hidden 0: ffn_hidden)"
      )
    if not self.num_experts:
      if self.expert_hidden:
        raise ValueError(f"expert_hidden={self.expert_hidden} needs num_experts > 0 (num_experts=0: a dense model)")
      return
    if not 1 <= self.top_k <= self.num_experts:
      raise ValueError(f"top_k={self.top_k} must be in [1, num_experts={self.num_experts}]")
    if self.quantizer_backend == "pallas":
      raise ValueError(
        f"quantizer_backend='pallas' with num_experts={self.num_experts}: fp4jax.ragged_dot has no Pallas "
        "quantizers yet; use 'xla' or 'auto'"
      )

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads

  @property
  def moe_hidden(self) -> int:
    """Each expert's SwiGLU width: ``expert_hidden``, or ``ffn_hidden`` where that is 0."""
    return self.expert_hidden or self.ffn_hidden

  def stack_unroll(self, stack: LayerStack) -> int:
    """Blocks per loop iteration of ``stack`` (``nn.scan``'s ``unroll``).

    Args:
      stack: one of ``layer_stacks(self)``.

    Returns:
      ``scan_unroll`` capped at ``stack.length``; for ``"auto"`` the whole stack if it is BF16, or if its recipe is
      in :data:`UNROLLED_RECIPES`, the model is dense and its quantizers are GPU kernels (``quantizer_backend``
      not "xla" on a device where ``fp4jax.backends.has_pallas_triton``), and 1 otherwise (see the module
      docstring).
    """
    if self.scan_unroll == "auto":
      if stack.recipe == BF16_RECIPE:
        return stack.length
      kernels = self.quantizer_backend != "xla" and fp4jax.backends.has_pallas_triton()
      return stack.length if stack.recipe in UNROLLED_RECIPES and not self.num_experts and kernels else 1
    return min(self.scan_unroll, stack.length)

  def jax_config(self) -> dict[str, bool]:
    """The JAX config values the model's steps are lowered under (``experiments.lowering.scoped``).

    Returns:
      ``{"jax_threefry_gpu_kernel_lowering": value}``: ``threefry_kernel``; for ``"auto"`` whether a stack under an
      FP4 recipe runs more than one block per loop iteration (see the module docstring).
    """
    value = self.threefry_kernel
    if value == "auto":
      value = any(s.recipe != BF16_RECIPE and self.stack_unroll(s) > 1 for s in layer_stacks(self))
    return {"jax_threefry_gpu_kernel_lowering": value}

  def block_recompute(self, recipe: str) -> Literal["none", "norms", "norms_swiglu"]:
    """What a block under ``recipe`` recomputes in its backward pass.

    Args:
      recipe: the block's recipe (``layer_recipe``).

    Returns:
      ``recompute``; for ``"auto"`` "norms_swiglu" in an FP4 block and "none" in a BF16 block (see the module
      docstring).
    """
    if self.recompute == "auto":
      return "none" if recipe == BF16_RECIPE else "norms_swiglu"
    return self.recompute

  def layer_recipe(self, layer: int) -> str:
    """The recipe of block ``layer``: BF16 for the first ``bf16_first`` and last ``bf16_last`` blocks."""
    if layer < self.bf16_first or layer >= self.n_layers - self.bf16_last:
      return BF16_RECIPE
    return self.recipe


@dataclasses.dataclass(frozen=True)
class LayerStack:
  """A contiguous run of blocks under one recipe, scanned as one module: blocks start .. start + length - 1."""

  name: str
  recipe: str
  start: int
  length: int


STACK_NAMES = ("first_blocks", "blocks", "last_blocks")


def layer_stacks(config: ModelConfig) -> tuple[LayerStack, ...]:
  """The non-empty stacks of ``config``, in order: the first BF16 blocks, the recipe's blocks, the last BF16 blocks."""
  middle = config.n_layers - config.bf16_first - config.bf16_last
  runs = zip(STACK_NAMES, (BF16_RECIPE, config.recipe, BF16_RECIPE), (config.bf16_first, middle, config.bf16_last))
  stacks, start = [], 0
  for name, recipe, length in runs:
    if length:
      stacks.append(LayerStack(name, recipe, start, length))
    start += length
  return tuple(stacks)


def model_config(size: str, **overrides) -> ModelConfig:
  """The :class:`ModelConfig` of a named size (a key of :data:`SIZES`), with any field overridden."""
  if size not in SIZES:
    raise ValueError(f"model size {size!r} is not one of {list(SIZES)}")
  row = SIZES[size]
  shape = dict(
    n_layers=row.n_layers,
    d_model=row.d_model,
    n_heads=row.n_heads,
    ffn_hidden=swiglu_hidden(row.d_model, row.ffn_multiple),
  )
  if row.num_experts:
    shape.update(num_experts=row.num_experts, top_k=row.top_k, expert_hidden=row.expert_hidden)
  return ModelConfig(**{**shape, **overrides})


def parameter_count(config: ModelConfig) -> dict[str, int]:
  """Analytic parameter counts: per block 4d² (attention) + 3dh (SwiGLU) + 2d (norms); plus final norm d. With
  E = ``num_experts`` > 0 the SwiGLU's 3dh becomes d·E (router) + E·3dh (experts, h = ``moe_hidden``).

  ``non_embedding`` excludes the input embedding and the LM head (V·d each); ``total`` includes them;
  ``active_non_embedding`` counts the non-embedding parameters one token runs through (an MoE block's router and
  top_k of its experts: d·E + top_k·3dh; the dense model's all).
  """
  d, v, layers = config.d_model, config.vocab_size, config.n_layers
  expert = 3 * d * config.moe_hidden
  mlp, active_mlp = 3 * d * config.ffn_hidden, 3 * d * config.ffn_hidden
  if config.num_experts:
    router = d * config.num_experts
    mlp, active_mlp = router + config.num_experts * expert, router + config.top_k * expert
  per_block = 4 * d * d + 2 * d
  non_embedding = layers * (per_block + mlp) + d
  return {
    "non_embedding": non_embedding,
    "active_non_embedding": layers * (per_block + active_mlp) + d,
    "total": non_embedding + 2 * v * d,
  }


@dataclasses.dataclass(frozen=True)
class TensorParallel:
  """Megatron tensor parallelism written out, for a model run inside ``jax.shard_map`` (or ``jax.vmap``) over the
  named axis ``axis`` of ``shards`` devices: each holds n_heads/shards heads and ffn_hidden/shards hidden units.

  Per block, with the (replicated) normed input x and shard s's column slices of q, k, v, gate, up and row slices
  of o, down: ``Attn(x) = Σ_s o_s(attention of heads_s(x))``, ``SwiGLU(x) = Σ_s down_s(silu(gate_s(x)) ⊙ up_s(x))``.
  The Σ_s is ``fp4jax.sharding.sum_from_shards`` (the pairwise tree over s, in fp32, rounded once to the
  activation dtype), and x enters by ``copy_to_shards``, whose backward adds the shards' gradients the same way;
  the FP4 dots run ``fp4jax.sharding.sharded`` recipes (outputs split for column-parallel, inputs for
  row-parallel), so every quantized operand is the logical tensor's. Everything outside the blocks is replicated.
  ``tokens``: the mesh axis the batch is also split over (data parallelism beside the tensor parallelism), whose
  split the recipes are marked with first (``fp4jax.sharding.token_sharded``); None: every shard sees the whole
  batch.
  """

  axis: str
  shards: int
  tokens: str | None = None

  def __post_init__(self):
    if self.shards < 1:
      raise ValueError(f"TensorParallel.shards must be >= 1, got {self.shards}")

  def enter(self, x: jax.Array) -> jax.Array:
    return fp4jax.sharding.copy_to_shards(x.astype(jnp.float32), self.axis).astype(x.dtype)

  def exit(self, x: jax.Array) -> jax.Array:
    return fp4jax.sharding.sum_from_shards(x.astype(jnp.float32), self.axis).astype(x.dtype)


def resolve_recipe(recipe: str) -> str:
  """``recipe`` as a name ``fp4jax.recipes.get`` takes: a registered name (``fp4jax.recipes.names()``: the
  published recipes and any a caller ``register``-ed) as it is, or ``"module:attr"``, a recipe of one's own: the
  ``fp4jax.recipes.Recipe`` (e.g. from ``fp4jax.recipes.compose``), or a function of no arguments returning one,
  called ``attr`` in the importable ``module``, registered under the string itself (so config.json names it and a
  resume, a sweep's worker or an evaluation loads it again).

  Args:
    recipe: a recipe name or ``"module:attr"``.

  Returns:
    ``recipe``, now registered.

  Raises:
    ValueError: not a registered name, or ``module:attr`` that does not load a ``Recipe`` (naming why).
  """
  if recipe in fp4jax.recipes.names():
    return recipe
  module_name, sep, attr = recipe.partition(":")
  if not (sep and module_name and attr):
    raise ValueError(
      f"unknown recipe {recipe!r}: expected one of {fp4jax.recipes.names()}, or 'module:attr' naming a "
      "fp4jax.recipes.Recipe of one's own (e.g. from fp4jax.recipes.compose)"
    )
  try:
    found = getattr(importlib.import_module(module_name), attr)
  except (ImportError, AttributeError) as err:
    raise ValueError(f"recipe {recipe!r}: cannot load {attr!r} from module {module_name!r} ({err})") from err
  if callable(found) and not isinstance(found, fp4jax.recipes.Recipe):
    found = found()
  if not isinstance(found, fp4jax.recipes.Recipe):
    raise ValueError(f"recipe {recipe!r}: {module_name}.{attr} is not an fp4jax.recipes.Recipe (got {found!r})")
  fp4jax.recipes.register(dataclasses.replace(found, name=recipe))
  return recipe


def projection_recipe(recipe: str, tp: TensorParallel | None = None, split: str = "", causal: bool = False):
  """The recipe a projection's dot runs under FP4 ``recipe`` (``resolve_recipe``: a registered name or
  ``"module:attr"``): ``causal``: ``fp4jax.recipes.causal(recipe)`` (per-token amax); with ``tp``, marked
  ``fp4jax.sharding.sharded`` along ``split`` ("outputs" or "inputs") over ``tp.axis`` (after the tokens over
  ``tp.tokens``, if it names an axis)."""
  resolve_recipe(recipe)
  marked = fp4jax.recipes.causal(recipe) if causal else recipe
  if tp is not None and tp.tokens is not None:
    marked = fp4jax.sharding.token_sharded(marked, tp.tokens)
  if tp is not None:
    marked = fp4jax.sharding.sharded(marked, tp.axis, split)
  return marked


def projection_dot_cls(
  recipe: str,
  backend: str = "xla",
  tp: TensorParallel | None = None,
  split: str = "",
  causal: bool = False,
  prequantized: fp4jax.PrequantizedWeight | None = None,
):
  """The ``dot_general_cls`` for a projection under ``recipe``: None (flax's plain dot) for BF16, else fp4jax's
  under ``projection_recipe(recipe, tp, split, causal)`` with quantizer ``backend`` and the kernel's
  ``prequantized`` operands (``fp4jax.prequantize_weight``; None: the dot quantizes it)."""
  if recipe == BF16_RECIPE:
    return None
  marked = projection_recipe(recipe, tp, split, causal)
  return functools.partial(DotGeneral, recipe=marked, backend=backend, rhs_prequantized=prequantized)


def expert_recipe(recipe: str, causal: bool = False):
  """The recipe of an MoE block's ``fp4jax.flax.linen.MoE`` under ``recipe``: ``"bf16"`` (``jax.lax.ragged_dot``)
  as is, else the name (``resolve_recipe``), or its ``fp4jax.recipes.causal`` variant with ``causal``."""
  if recipe == BF16_RECIPE:
    return recipe
  resolve_recipe(recipe)
  return fp4jax.recipes.causal(recipe) if causal else recipe


def apply_rope(x: jax.Array, theta: float) -> jax.Array:
  """Rotary position embedding (rotate-half convention) on x of shape (batch, seq, heads, head_dim).

  With x = [x₁, x₂] split in halves and ω_i = θ^(−2i/head_dim), position t:
    RoPE(x)_t = [x₁ cos(tω) − x₂ sin(tω),  x₂ cos(tω) + x₁ sin(tω)]       (computed in fp32, cast back).
  """
  seq, dim = x.shape[1], x.shape[3]
  inv_freq = theta ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
  angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv_freq[None, :]
  cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _projection(
  config: ModelConfig,
  recipe: str,
  features: int,
  name: str,
  init_std: float = INIT_STD,
  tp: TensorParallel | None = None,
  split: str = "",
  prequantized: dict | None = None,
) -> nn.Dense:
  """A projection ``name``; ``prequantized``: its layer's ``PROJECTIONS`` operands (``Llama.prequantized``)."""
  pre = None if prequantized is None else prequantized[name]
  return nn.Dense(
    features,
    use_bias=False,
    dtype=config.dtype,
    param_dtype=config.param_dtype,
    kernel_init=nn.initializers.normal(init_std),
    dot_general_cls=projection_dot_cls(recipe, config.quantizer_backend, tp, split, config.causal_amax, pre),
    name=name,
  )


_RecomputedRMSNorm = nn.remat(nn.RMSNorm, prevent_cse=False)


def _norm(config: ModelConfig, recipe: str, name: str) -> nn.Module:
  norm = nn.RMSNorm if config.block_recompute(recipe) == "none" else _RecomputedRMSNorm
  return norm(epsilon=config.norm_eps, dtype=config.dtype, param_dtype=config.param_dtype, name=name)


def _swiglu_product(gate: jax.Array, up: jax.Array) -> jax.Array:
  return nn.silu(gate) * up


def attention_implementation(config: ModelConfig, platform: str | None = None) -> str:
  """``jax.nn.dot_product_attention``'s implementation for ``config``: its ``attention_impl`` when explicit; for
  "auto" (or None) cuDNN's flash attention on a GPU (``platform``, default ``jax.default_backend()``) with bf16 or
  fp16 activations, XLA's otherwise. Both compute softmax(q kᵀ / sqrt(d_head) + causal mask) v; they differ in
  rounding only."""
  if config.attention_impl not in (None, "auto"):
    return config.attention_impl
  platform = platform or jax.default_backend()
  fast = platform == "gpu" and jnp.dtype(config.dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
  return "cudnn" if fast else "xla"


class Attention(nn.Module):
  """Causal multi-head self-attention with RoPE; q, k, v, o are the recipe's projections (with ``tp``: this
  shard's heads, :class:`TensorParallel`)."""

  config: ModelConfig
  recipe: str
  tp: TensorParallel | None = None

  @nn.compact
  def __call__(self, x: jax.Array, prequantized: dict | None = None) -> jax.Array:
    cfg, tp, pre = self.config, self.tp, prequantized
    shards = tp.shards if tp else 1
    batch, seq, _ = x.shape
    width = cfg.d_model // shards
    heads = (batch, seq, cfg.n_heads // shards, cfg.head_dim)
    x = tp.enter(x) if tp else x
    q = _projection(cfg, self.recipe, width, "q", tp=tp, split="outputs", prequantized=pre)(x).reshape(heads)
    k = _projection(cfg, self.recipe, width, "k", tp=tp, split="outputs", prequantized=pre)(x).reshape(heads)
    v = _projection(cfg, self.recipe, width, "v", tp=tp, split="outputs", prequantized=pre)(x).reshape(heads)
    q, k = apply_rope(q, cfg.rope_theta), apply_rope(k, cfg.rope_theta)
    y = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=attention_implementation(cfg))
    out_std = INIT_STD / math.sqrt(2 * cfg.n_layers)
    o = _projection(cfg, self.recipe, cfg.d_model, "o", out_std, tp, "inputs", prequantized=pre)
    out = o(y.reshape(batch, seq, width))
    return tp.exit(out) if tp else out


class SwiGLU(nn.Module):
  """down(silu(gate(x)) ⊙ up(x)); gate, up, down are the recipe's projections (with ``tp``: this shard's hidden
  units, :class:`TensorParallel`)."""

  config: ModelConfig
  recipe: str
  tp: TensorParallel | None = None

  @nn.compact
  def __call__(self, x: jax.Array, prequantized: dict | None = None) -> jax.Array:
    cfg, tp, pre = self.config, self.tp, prequantized
    hidden = cfg.ffn_hidden // (tp.shards if tp else 1)
    x = tp.enter(x) if tp else x
    gate = _projection(cfg, self.recipe, hidden, "gate", tp=tp, split="outputs", prequantized=pre)(x)
    up = _projection(cfg, self.recipe, hidden, "up", tp=tp, split="outputs", prequantized=pre)(x)
    out_std = INIT_STD / math.sqrt(2 * cfg.n_layers)
    swiglu = cfg.block_recompute(self.recipe) == "norms_swiglu"
    product = jax.checkpoint(_swiglu_product, prevent_cse=False) if swiglu else _swiglu_product
    down = _projection(cfg, self.recipe, cfg.d_model, "down", out_std, tp, "inputs", prequantized=pre)
    out = down(product(gate, up))
    return tp.exit(out) if tp else out


def expert_init(config: ModelConfig):
  """The experts' initializer: N(0, 0.02²) for ``w_in`` (E, d, 2h), the residual outputs' N(0, (0.02/sqrt(2L))²)
  for ``w_out`` (E, h, d). ``fp4jax.flax.linen.MoE`` takes one initializer for both; they are told apart by shape,
  which never coincides (it would need d = h = 2h)."""
  w_out = (config.num_experts, config.moe_hidden, config.d_model)
  out_std = INIT_STD / math.sqrt(2 * config.n_layers)

  def init(key: jax.Array, shape, dtype=jnp.float32) -> jax.Array:
    return nn.initializers.normal(out_std if tuple(shape) == w_out else INIT_STD)(key, shape, dtype)

  return init


def _mlp(config: ModelConfig, recipe: str, tp: TensorParallel | None) -> nn.Module:
  """A block's MLP, named "mlp": the SwiGLU, or with ``config.num_experts`` > 0 an ``fp4jax.flax.linen.MoE``."""
  if not config.num_experts:
    return SwiGLU(config, recipe, tp, name="mlp")
  return MoE(
    config.num_experts,
    config.top_k,
    config.moe_hidden,
    recipe=expert_recipe(recipe, config.causal_amax),
    backend=config.quantizer_backend,
    kernel_init=expert_init(config),
    param_dtype=config.param_dtype,
    name="mlp",
  )


class Block(nn.Module):
  """Pre-norm transformer block: h + Attn(RMSNorm(h)), then h + SwiGLU(RMSNorm(h)) (or MoE, ``num_experts`` > 0).

  A scan body: carry h and the layer's slice of ``Llama.prequantized`` (or None) -> (new h, no per-layer output).
  """

  config: ModelConfig
  recipe: str
  tp: TensorParallel | None = None

  @nn.compact
  def __call__(self, h: jax.Array, prequantized: dict | None = None) -> tuple[jax.Array, None]:
    cfg, pre = self.config, prequantized or {}
    if cfg.num_experts and self.tp is not None:
      raise ValueError(
        f"num_experts={cfg.num_experts}: tensor parallelism (TensorParallel, --tensor-shards) is not "
        "supported for mixture-of-experts blocks; use a dense model or data parallelism"
      )
    attn = Attention(cfg, self.recipe, self.tp, name="attn")
    h = h + attn(_norm(cfg, self.recipe, "attn_norm")(h), pre.get("attn"))
    mlp_in = _norm(cfg, self.recipe, "mlp_norm")(h)
    mlp = _mlp(cfg, self.recipe, self.tp)
    return h + (mlp(mlp_in, pre["mlp"]) if "mlp" in pre else mlp(mlp_in)), None


def scanned_blocks(
  config: ModelConfig, stack: LayerStack, tp: TensorParallel | None = None, grad_sum: Callable | None = None
) -> nn.Module:
  """``stack.length`` blocks as one ``nn.scan``: parameters (and sown "intermediates") stacked on a leading layer
  axis, the "params" and "quant" streams split per layer; each block under ``nn.remat`` if ``config.remat``;
  ``config.stack_unroll(stack)`` blocks per loop iteration. ``grad_sum`` (see :class:`Llama`) takes each block's
  own parameters (``{"params": ...}``, one layer's slice) inside the loop. Called as ``(h, prequantized)``: the
  stack's ``Llama.prequantized`` (sliced per layer) or None."""
  block = nn.remat(Block, prevent_cse=False) if config.remat else Block  # scan already keeps remat's CSE apart
  if grad_sum is not None:
    block = nn.map_variables(block, "params", trans_in_fn=grad_sum, init=True)
  scan = nn.scan(
    block,
    variable_axes={"params": 0, "intermediates": 0},
    split_rngs={"params": True, "quant": True},
    length=stack.length,
    unroll=config.stack_unroll(stack),
  )
  return scan(config, stack.recipe, tp, name=stack.name)


ONE_HOT_MAX_VOCAB = 4096  # up to this vocabulary the embedding is a one-hot GEMM (see TokenEmbedding)


class TokenEmbedding(nn.Module):
  """tokens int (batch, seq) → rows of the table E (vocab, d) in ``dtype``; the parameter is flax's nn.Embed's
  ("embedding", N(0, 0.02²)).

  Vocabularies up to ONE_HOT_MAX_VOCAB: h = onehot(tokens) · E, exact (one nonzero product per output), so the
  gradient dE = onehot(tokens)ᵀ · dh is a GEMM accumulating in fp32, rounded once to ``dtype``. A gather's
  gradient is a scatter-add, which serializes on a GPU when a small vocabulary makes every row collide. Larger
  vocabularies gather (one-hot would cost 2·V·d FLOPs per token).
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    cfg = self.config
    table = self.param(
      "embedding", nn.initializers.normal(INIT_STD), (cfg.vocab_size, cfg.d_model), cfg.param_dtype
    ).astype(cfg.dtype)
    if cfg.vocab_size > ONE_HOT_MAX_VOCAB:
      return jnp.take(table, tokens, axis=0)
    one_hot = jax.nn.one_hot(tokens, cfg.vocab_size, dtype=cfg.dtype)
    return jnp.dot(one_hot, table, preferred_element_type=jnp.float32).astype(cfg.dtype)


class Llama(nn.Module):
  """tokens int (batch, seq) → next-token logits fp32 (batch, seq, vocab).

  Random recipes draw from the RNG stream "quant": ``model.apply(params, tokens, rngs={"quant": key})``. With
  ``tp`` the blocks are one shard's (:class:`TensorParallel`), taking their parameters' shard slices.
  """

  config: ModelConfig
  tp: TensorParallel | None = None
  # an identity on each block's parameters whose backward sums their gradients over the data-parallel devices
  # (``sharding.sum_in_backward``), applied inside the layer loop: the sums of a block's gradients start as soon as
  # its backward has made them, while the loop goes on to the blocks before it
  block_grad_sum: Callable | None = None

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    cfg = self.config
    if tokens.ndim != 2:
      raise ValueError(f"tokens must have shape (batch, seq), got {tokens.shape}")
    h = TokenEmbedding(cfg, name="embed")(tokens)
    for stack in layer_stacks(cfg):
      h, _ = scanned_blocks(cfg, stack, self.tp, self.block_grad_sum)(h, self.prequantized(stack))
    h = _norm(cfg, BF16_RECIPE, "final_norm")(h)  # the final norm and the head run in BF16 under every recipe
    logits = nn.Dense(
      cfg.vocab_size,
      use_bias=False,
      dtype=cfg.dtype,
      param_dtype=cfg.param_dtype,
      kernel_init=nn.initializers.normal(INIT_STD),
      name="lm_head",
    )(h)
    return logits.astype(jnp.float32)

  def prequantized(self, stack: LayerStack) -> dict | None:
    """``stack``'s projection weights quantized for all of its layers before its loop, ``{"attn": {"q": ...},
    "mlp": {...}}`` (``PROJECTIONS``; each a ``fp4jax.PrequantizedWeight`` with a leading layer axis: each kernel
    promoted to ``config.dtype`` as ``nn.Dense`` promotes it, quantized under ``jax.vmap``), where
    ``config.prequantize_weights`` asks for it and the stack can: an FP4 recipe that
    ``fp4jax.prequantize_refusal`` accepts, dense blocks, no tensor parallelism, parameters already made (not in
    ``init``). Else None: the projections quantize their weights in the loop."""
    cfg = self.config
    if not cfg.prequantize_weights or stack.recipe == BF16_RECIPE or self.tp is not None or cfg.num_experts:
      return None
    recipe = projection_recipe(stack.recipe, causal=cfg.causal_amax)
    if self.is_initializing() or fp4jax.prequantize_refusal(recipe) is not None:
      return None
    params = self.variables["params"][stack.name]
    dense = (((2,), (0,)), ((), ()))  # nn.Dense's dimension_numbers on (batch, seq, features) inputs

    def one_layer(kernel):
      return fp4jax.prequantize_weight(kernel.astype(cfg.dtype), dense, recipe=recipe, backend=cfg.quantizer_backend)

    quantize = jax.vmap(one_layer)
    return {part: {name: quantize(params[part][name]["kernel"]) for name in names} for part, names in PROJECTIONS}


# each block's projections by submodule: those ``Llama.prequantized`` quantizes ahead of the layer loop
PROJECTIONS = (("attn", ("q", "k", "v", "o")), ("mlp", ("gate", "up", "down")))


def init_params(config: ModelConfig, key: jax.Array, seq_len: int = 8):
  """Fresh fp32 parameters for ``config`` from ``key``.

  Parameters do not depend on the recipe (the FP4 dots have none, and their "quant" draws are a separate RNG
  stream), so they are initialized through the BF16 model: no quantizer is traced or run (seconds, not tens of).
  """
  tokens = jnp.zeros((1, seq_len), jnp.int32)
  return Llama(dataclasses.replace(config, recipe=BF16_RECIPE)).init({"params": key}, tokens)["params"]
