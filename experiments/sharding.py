"""Sharded training layouts for the experiments' Llama model: data parallel, FSDP and Megatron-style tensor parallel.

A ``Layout`` is a 2D device mesh ``(data, model)`` plus the FSDP switch; the training CLI takes it as
``--mesh data=4`` (DP), ``--mesh data=4 --fsdp`` (FSDP: parameters and optimizer state sharded over the data axis),
``--mesh model=2`` (TP) or ``--mesh data=2,model=2`` (DP x TP).

Everything runs under plain ``jax.jit`` with ``NamedSharding`` on the parameters, the optimizer state and the
batches; XLA's SPMD partitioner inserts every collective. The program is the single-device program, so every
quantizer sees the logical tensor: the NVFP4 tensor amax is a max over all shards (exact in any order), blocks and
Hadamard chunks are taken over logical indices, and random bits are ``fp4jax.bits`` hashes of global element
indices. Quantized operands are therefore bit-identical to one device's; what may differ is the fp32 summation order
of reductions over a sharded axis (the wgrad GEMM over tokens under DP, the row-parallel GEMMs over features under
TP, the loss mean), which XLA splits into per-shard partial sums plus an all-reduce.

Parameter partition specs (flax ``Dense`` kernels are ``(in, out)``; F = "data" with FSDP, else None). The blocks'
parameters live in scanned stacks (``model.STACK_NAMES``) with a leading layer axis, which is replicated:

    q, k, v, gate, up   (layers, in, out)   P(None, F, "model")    outputs (heads / hidden units) split over "model"
    o, down             (layers, in, out)   P(None, "model", F)    inputs split over "model"
    embed (vocab, d)                        P(F, None)
    lm_head (d, vocab)                      P(None, F)
    MoE router (layers, d, E)               P(None, F, None)
    MoE w_in (layers, E, d, 2h)             P(None, None, F, None)   experts replicated (no expert parallelism)
    MoE w_out (layers, E, h, d)             P(None, None, None, F)
    norm gains, scalars                     replicated
    batch (B, T+1)                          P("data", None)

Every optimizer-state leaf shaped like a parameter takes that parameter's spec. Gradient all-reduces happen inside
the wgrad GEMMs, whose accumulator is fp32 (``fp4jax.operand.matmul``), so gradients are reduced in fp32 before the
fp32 master update. Data parallelism (with or without FSDP) of an FP4 model, by default (the Pallas quantizer
kernels cannot be split by the partitioner), and with ``--grad-comm-dtype bfloat16|float8_e4m3fn``, instead
differentiates each data shard's share of the loss under ``jax.shard_map`` and all-reduces the gradients in the
``--grad-comm-dtype`` (:func:`data_parallel_value_and_grad`, :func:`all_reduce_sum`; with ``--fsdp`` the sharded
parameters are all-gathered in the shard and their gradients reduce-scattered, :func:`reduce_gradients`); its FP4
projections run ``fp4jax.sharding.token_sharded`` recipes, so their quantized operands are still those of the global
program (``experiments.train.token_sharded_data_parallel`` says when).

Mixture-of-experts models (``ModelConfig.num_experts`` > 0) run data parallel and FSDP only: ``check_layout``
refuses a model axis, :func:`token_sharded_model` (``--grad-comm-dtype`` other than float32) an FP4 MoE stack; with
float32 gradients they keep the plain ``jit``.

``check_layout`` rejects, before anything is compiled, a layout that does not split the model evenly or whose shard
along a quantized GEMM axis is not a whole number of the recipe's blocks and Hadamard chunks (a block or a
Hadamard chunk would straddle two devices), e.g. quartet2's 128-point backward Hadamard over tokens needs
(batch / data) x seq to be a multiple of 128.

Multi-host: call :func:`initialize_distributed` (the CLI's ``--distributed``) in every process before any other
JAX call; the mesh then spans the devices of all processes, and every process must run the same program.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Collection

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import fp4jax
import fp4jax.flax
from fp4jax import fp8
from fp4jax._src.ieee import div_rn
from fp4jax.formats import BlockFormat
from fp4jax.rounding import rtn_bf16, rtn_e4m3
from fp4jax_experiments import model as model_lib

DATA, MODEL = "data", "model"
AXES = (DATA, MODEL)
COLUMN_PARALLEL = ("q", "k", "v", "gate", "up")
ROW_PARALLEL = ("o", "down")
# MoE experts (model.STACK_NAMES stacks): the axis of d_model, split over the data axis under FSDP
EXPERT_D_AXIS = {"w_in": 2, "w_out": 3}
# (contraction axis, other axis) of each GEMM operand in the canonical form X (M, K), W (N, K), dY (M, N) of
# fp4jax.dot: M = tokens, K = layer inputs, N = layer outputs (fp4jax/dot.py).
OPERAND_AXES = {
  "fwd_lhs": ("K", "M"),
  "fwd_rhs": ("K", "N"),
  "dgrad_lhs": ("N", "M"),
  "dgrad_rhs": ("N", "K"),
  "wgrad_lhs": ("M", "N"),
  "wgrad_rhs": ("M", "K"),
}


@dataclasses.dataclass(frozen=True)
class Layout:
  """A (data, model) device mesh and whether parameters are sharded over the data axis (FSDP)."""

  data: int = 1
  model: int = 1
  fsdp: bool = False

  def __post_init__(self):
    for name in AXES:
      size = getattr(self, name)
      if not isinstance(size, int) or size < 1:
        raise ValueError(f"mesh axis {name!r} must be a positive integer, got {size!r}")
    if self.fsdp and self.data == 1:
      raise ValueError("fsdp shards parameters over the data axis: it needs --mesh data=N with N > 1")

  @property
  def n_devices(self) -> int:
    return self.data * self.model

  def describe(self) -> str:
    parts = [f"{name}={getattr(self, name)}" for name in AXES if getattr(self, name) > 1] or ["data=1"]
    return ",".join(parts) + (" fsdp" if self.fsdp else "")


def parse_mesh(text: str, fsdp: bool = False) -> Layout:
  """``"data=4"`` / ``"data=2,model=2"`` / ``"model=2"`` -> ``Layout`` (axes not named are 1)."""
  sizes = {}
  for part in text.split(","):
    match = re.fullmatch(r"\s*(\w+)\s*=\s*(\d+)\s*", part)
    if not match or match.group(1) not in AXES or match.group(1) in sizes:
      raise ValueError(
        f"--mesh {text!r}: expected comma-separated axis=size with axes {AXES}, "
        "each at most once, e.g. 'data=4' or 'data=2,model=2'"
      )
    sizes[match.group(1)] = int(match.group(2))
  return Layout(**sizes, fsdp=fsdp)


def make_mesh(layout: Layout, devices=None) -> Mesh:
  """The ``(data, model)`` mesh over the first ``layout.n_devices`` of ``devices`` (default: all, every process).

  With several processes the mesh must span all devices of all of them.
  """
  devices = list(jax.devices() if devices is None else devices)
  if layout.n_devices > len(devices):
    raise ValueError(
      f"mesh {layout.describe()} needs {layout.n_devices} devices, only {len(devices)} are visible "
      "(on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax)"
    )
  if jax.process_count() > 1 and layout.n_devices != len(devices):
    raise ValueError(
      f"with {jax.process_count()} processes the mesh must use all {len(devices)} devices, "
      f"got {layout.describe()} ({layout.n_devices} devices)"
    )
  grid = np.asarray(devices[: layout.n_devices], dtype=object).reshape(layout.data, layout.model)
  return Mesh(grid, AXES, axis_types=(AxisType.Auto, AxisType.Auto))


# ------------------------------------------------------------------------------------------------ partition specs
def _path_names(path) -> list[str]:
  return [str(getattr(k, "key", getattr(k, "name", k))) for k in path]


def leaf_spec(path, shape: tuple[int, ...], layout: Layout) -> P:
  """The partition spec of one parameter or optimizer-state leaf (see the module docstring's table)."""
  fsdp = DATA if layout.fsdp else None
  names = _path_names(path)
  stacked = any(name in model_lib.STACK_NAMES for name in names)
  if stacked and names and names[-1] in EXPERT_D_AXIS and len(shape) == 4:  # (layers, E, in, out)
    spec = [None] * 4
    spec[EXPERT_D_AXIS[names[-1]]] = fsdp
    return P(*spec)
  matrix_rank = 3 if stacked else 2
  if len(names) < 2 or names[-1] not in ("kernel", "embedding") or len(shape) != matrix_rank:
    return P()
  module = names[-2]
  if stacked and module in COLUMN_PARALLEL:  # the leading layer axis is replicated
    return P(None, fsdp, MODEL)
  if stacked and module in ROW_PARALLEL:
    return P(None, MODEL, fsdp)
  if stacked and module == "router":
    return P(None, fsdp, None)
  if not stacked and module == "embed":
    return P(fsdp, None)
  if not stacked and module == "lm_head":
    return P(None, fsdp)
  raise ValueError(
    f"no sharding rule for the parameter of shape {shape} at {jax.tree_util.keystr(path)} (module {module!r})"
  )


def state_shardings(state, mesh: Mesh, layout: Layout):
  """A pytree of ``NamedSharding`` matching ``state`` (params, optimizer state; arrays or ShapeDtypeStructs)."""
  return jax.tree_util.tree_map_with_path(
    lambda path, leaf: NamedSharding(mesh, leaf_spec(path, np.shape(leaf), layout)), state
  )


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Token batches (B, T+1): rows split over the data axis, replicated over the model axis."""
  return NamedSharding(mesh, P(DATA, None))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def place(tree, shardings):
  """Global arrays from values every process holds in full (a batch, the initial state, a key): each process
  copies its devices' shards. Unlike ``jax.device_put`` this also works when the mesh spans several processes."""

  def one(leaf, leaf_sharding):
    return jax.make_array_from_callback(np.shape(leaf), leaf_sharding, lambda index: leaf[index])

  return jax.tree.map(one, tree, shardings)


# ------------------------------------------------------------------------------------------------ layout checks
def _recipe_units(recipe) -> dict[str, tuple[int, int]]:
  """Per quantized operand of ``recipe``: (unit along the contraction axis, unit along the other axis).

  The contraction unit is lcm(block, Hadamard size); the other unit is the 2D tile height (1 for 1D blocks).
  Per-tensor (FP8) and per-row (E2M1 channel) scales have no blocks: their reductions are exact under any split
  (block-scaled FP8, MXFP8 and FP8_BLOCK, has blocks as FP4 does).
  """
  units = {}
  for name in OPERAND_AXES:
    spec = getattr(recipe, name)
    if not isinstance(spec.fmt, BlockFormat) and not spec.hadamard:
      continue
    block = spec.fmt.block_size if isinstance(spec.fmt, BlockFormat) else 1
    rows = 1
    if spec.block_shape is not None:
      rows, block = spec.block_shape
    units[name] = (math.lcm(block, spec.hadamard or 1), rows)
  return units


def _projection_axes(
  config: model_lib.ModelConfig, layout: Layout, batch_size: int, seq_len: int, microbatches: int = 0
):
  """Per projection kind: {axis: (logical length, number of parts)} for M (tokens), K (inputs), N (outputs); with
  ``microbatches`` the tokens are cut into that many quantized tensors and the parameters are whole (gathered)."""
  fsdp = layout.data if layout.fsdp and not microbatches else 1
  tokens = (batch_size * seq_len, microbatches or layout.data)
  d, h = config.d_model, config.ffn_hidden
  return {
    "q/k/v": {"M": tokens, "K": (d, fsdp), "N": (d, layout.model)},
    "gate/up": {"M": tokens, "K": (d, fsdp), "N": (h, layout.model)},
    "o": {"M": tokens, "K": (d, layout.model), "N": (d, fsdp)},
    "down": {"M": tokens, "K": (h, layout.model), "N": (d, fsdp)},
  }


def check_layout(
  layout: Layout, config: model_lib.ModelConfig, batch_size: int, seq_len: int, microbatches: int = 0
) -> None:
  """Raise ValueError unless ``layout`` splits the model evenly and no FP4 block / Hadamard chunk straddles shards.

  ``seq_len`` is the number of tokens the model sees per row. Checked: batch_size % data, n_heads % model (tensor
  parallelism splits whole heads), d_model and ffn_hidden % model, the FSDP-sharded dims % data; then, for every
  FP4 projection recipe, every quantized operand and every GEMM axis split over the mesh, that the shard length is
  a multiple of the operand's block and Hadamard size (contraction axis) and 2D tile height (other axis).

  ``microbatches`` (``--deterministic R``, ``fp4jax_experiments.deterministic``): the quantized tensors are R
  microbatches, each whole on one device, and the parameters are gathered before use, so the token axis is checked
  against the R microbatches and the parameters' axes not at all.
  """
  if config.num_experts and layout.model > 1:
    raise ValueError(
      f"mesh {layout.describe()}: num_experts={config.num_experts}: a model axis (tensor parallelism) is not "
      "supported for mixture-of-experts models; use --mesh data=N (with or without --fsdp)"
    )
  dense_hidden = [] if config.num_experts else [("ffn_hidden", config.ffn_hidden, layout.data, DATA)]
  even = [("batch_size", batch_size, layout.data, DATA)]
  if layout.model > 1:
    even += [
      ("n_heads", config.n_heads, layout.model, MODEL),
      ("d_model", config.d_model, layout.model, MODEL),
      ("ffn_hidden", config.ffn_hidden, layout.model, MODEL),
    ]
  if layout.fsdp:
    even += [
      ("d_model", config.d_model, layout.data, DATA),
      *dense_hidden,
      ("vocab_size", config.vocab_size, layout.data, DATA),
    ]
  for name, value, parts, axis in even:
    if value % parts:
      raise ValueError(f"mesh {layout.describe()}: {name}={value} does not split evenly over {axis}={parts}")
  recipes = sorted({config.layer_recipe(i) for i in range(config.n_layers)} - {model_lib.BF16_RECIPE})
  cutter, pieces, fewer = (
    (f"--deterministic {microbatches} cuts", "microbatches", "fewer microbatches")
    if microbatches
    else ("the mesh splits", "shards", "fewer shards on that axis")
  )
  for recipe_name in recipes:
    units = _recipe_units(fp4jax.recipes.get(recipe_name))
    for projection, axes in _projection_axes(config, layout, batch_size, seq_len, microbatches).items():
      for operand, (contraction_unit, other_unit) in units.items():
        for axis, unit in zip(OPERAND_AXES[operand], (contraction_unit, other_unit)):
          length, parts = axes[axis]
          if parts > 1 and unit > 1 and (length // parts) % unit:
            raise ValueError(
              f"mesh {layout.describe()}: recipe {recipe_name!r} quantizes the {operand} operand of the "
              f"{projection} projections in units of {unit} along {_AXIS_NAMES[axis]} (length {length}), "
              f"but {cutter} that axis into {parts} {pieces} of {length // parts}: a block or Hadamard "
              f"chunk would straddle two {pieces}. Use {fewer} or a {_AXIS_FIX[axis]}"
            )


_AXIS_NAMES = {"M": "tokens (batch x seq)", "K": "the layer inputs", "N": "the layer outputs"}
_AXIS_FIX = {"M": "larger batch_size x seq_len", "K": "wider model", "N": "wider model"}


# ----------------------------------------------------------------------------------------- gradient communication
GRAD_COMM_DTYPES = ("float32", "bfloat16", "float8_e4m3fn")
# the wire dtypes whose sums are elementwise, so a block's slice can be summed where it is made (block_grad_sum)
PER_BLOCK_SUM_DTYPES = ("float32", "bfloat16")


def check_grad_comm(dtype: str, layout: Layout | None) -> None:
  """Raise ValueError unless gradients can be communicated in ``dtype`` (``--grad-comm-dtype``) on ``layout``.

  float32 (the default) works everywhere. bfloat16 / float8_e4m3fn replace the data-parallel all-reduce (with
  ``--fsdp``, the reduce-scatter of the sharded parameters' gradients), so they need a data-parallel mesh: a data
  axis of size > 1 and no model axis (tensor-parallel gradients are reduced inside the row-parallel GEMMs).
  """
  if dtype not in GRAD_COMM_DTYPES:
    raise ValueError(f"--grad-comm-dtype must be one of {GRAD_COMM_DTYPES}, got {dtype!r}")
  if dtype != "float32" and (layout is None or layout.data == 1 or layout.model > 1):
    raise ValueError(
      f"--grad-comm-dtype {dtype} compresses the data-parallel gradient all-reduce: it needs a "
      "data-parallel mesh (--mesh data=N with N > 1, no model axis; --fsdp allowed), got "
      f"{'one device' if layout is None else '--mesh ' + layout.describe()}"
    )


def _pow2_ceil(n: int) -> int:
  return 1 << (n - 1).bit_length()


def fp8_comm_scale(amax: jax.Array, n: int) -> jax.Array:
  """The E4M3 encode scale shared by ``n`` shards whose largest |gradient| is ``amax``: ``448 / (2^⌈log2 n⌉·amax)``.

  ``fp4jax.fp8.current_scale`` of a tensor whose amax is ``2^⌈log2 n⌉·amax`` (1 if amax is 0, NaN if it is not
  finite). The pre-division by the power of two 2^⌈log2 n⌉ >= n keeps every partial sum of the n encoded shards
  within ±448: each encoded value is at most 448/2^⌈log2 n⌉, itself on the E4M3 grid, so RNE cannot round above it.
  """
  return fp8.current_scale(jnp.float32(_pow2_ceil(n)) * amax, fp8.E4M3)


def comm_encode(g: jax.Array, dtype: str, amax: jax.Array | None, n: int) -> jax.Array:
  """A shard's gradient as sent: ``rtn_bf16(g)`` as bfloat16, or ``rtn_e4m3(g·fp8_comm_scale(amax, n))`` as
  float8_e4m3fn (``amax``: the max |g| over all ``n`` shards). Rounded explicitly; the cast is then exact."""
  g = g.astype(jnp.float32)
  if dtype == "bfloat16":
    return rtn_bf16(g).astype(jnp.bfloat16)
  return rtn_e4m3(g * fp8_comm_scale(amax, n)).astype(jnp.float8_e4m3fn)


def comm_decode(total: jax.Array, dtype: str, amax: jax.Array | None, n: int) -> jax.Array:
  """The fp32 sum from the all-reduced sum of ``n`` :func:`comm_encode` payloads: ``rtn_bf16(t)``, or
  ``rtn_e4m3(t) · f32(2^⌈log2 n⌉·amax / 448)``. Re-rounding puts the sum on the wire grid even where the backend
  reduced in a wider type (XLA:CPU) or XLA dropped the convert back to the wire dtype."""
  total = total.astype(jnp.float32)
  if dtype == "bfloat16":
    return rtn_bf16(total)
  return rtn_e4m3(total) * div_rn(jnp.float32(_pow2_ceil(n)) * amax, jnp.float32(fp8.E4M3.max))


def _sharded_dim(spec: P, axis_name: str) -> int | None:
  """The dimension that ``spec`` shards over ``axis_name``, or None."""
  return next((i for i, name in enumerate(spec) if name == axis_name), None)


def _sum_leaf(g: jax.Array, dtype: str, axis_name: str, dim: int | None = None) -> jax.Array:
  """The sum of ``g`` over ``axis_name`` communicated in ``dtype`` (:func:`all_reduce_sum`): all-reduced, or with
  ``dim`` reduce-scattered along it (each device keeps its slice of the same sum)."""
  if dim is None:
    reduce = lambda x: lax.psum(x, axis_name)  # noqa: E731
  else:
    reduce = lambda x: lax.psum_scatter(x, axis_name, scatter_dimension=dim, tiled=True)  # noqa: E731
  if dtype == "float32":
    return reduce(g.astype(jnp.float32))
  n, amax = lax.axis_size(axis_name), None
  if dtype == "float8_e4m3fn":
    amax = fp4jax.sharding.global_amax(g, axis_name)
  return comm_decode(reduce(comm_encode(g, dtype, amax, n)), dtype, amax, n)


def reduce_gradients(grads, specs, dtype: str, axis_name: str):
  """Each gradient leaf summed over the devices of ``axis_name``, communicated in ``dtype`` as
  :func:`all_reduce_sum` specifies: where its ``PartitionSpec`` in ``specs`` shards a dimension over
  ``axis_name`` (FSDP), reduce-scattered along that dimension (each device keeps its slice of the sum, the same
  values as the all-reduced sum's slice), else all-reduced. fp32 out. Call inside ``jax.shard_map``."""
  if dtype not in GRAD_COMM_DTYPES:
    raise ValueError(f"dtype must be one of {GRAD_COMM_DTYPES}, got {dtype!r}")
  one = lambda g, spec: _sum_leaf(g, dtype, axis_name, _sharded_dim(spec, axis_name))  # noqa: E731
  return jax.tree.map(one, grads, specs, is_leaf=lambda x: isinstance(x, P))


def all_reduce_sum(grads, dtype: str, axis_name: str):
  """Sum over the devices of mesh axis ``axis_name`` of each gradient leaf, communicated in ``dtype``; fp32 out.

  Call inside ``jax.shard_map`` (or any context binding ``axis_name``) with ``n`` devices on the axis.

  * float32: ``lax.psum(g)``.
  * bfloat16: ``rtn_bf16(psum(rtn_bf16(g)))`` (:func:`comm_encode`, :func:`comm_decode`).
  * float8_e4m3fn (per-tensor current scaling with a scale shared by all shards): ``amax = pmax(max|g|)`` (NaN if a
    shard holds NaN/Inf, so the sum is NaN: ``fp4jax.sharding.global_amax``), ``s = fp8_comm_scale(amax, n) =
    448/(2^⌈log2 n⌉·amax)``,
    sum ``= rtn_e4m3(psum(rtn_e4m3(g·s))) · f32(2^⌈log2 n⌉·amax / 448)``. Elements with ``|g·s| <= 2^-10`` (half
    E4M3's smallest subnormal), i.e. ``|g| <= 2^⌈log2 n⌉·amax / (448·2^10)``, flush to 0.

  Rounding is explicit (``fp4jax.rounding``: RNE, ties to even, E4M3 saturating at ±448), before the cast to the
  wire dtype and again on the reduced sum, so the sum lies on the bf16 / E4M3 grid whatever precision the backend
  reduces in (XLA:CPU promotes bf16 all-reduces to f32 and f8 ones to f16; NCCL adds bf16 hop by hop) and even
  where XLA drops a convert pair. This is the FP8 gradient communication that Microsoft's FP4 recipe keeps from
  its FP8 framework (arXiv 2501.17116; FP8-LM, arXiv 2310.18313, shares one scale across the GPUs before the FP8
  all-reduce); "Elsewhere: FP8 gradients/communication" in docs/FP4-REFERENCE.md §6.
  """
  if dtype not in GRAD_COMM_DTYPES:
    raise ValueError(f"dtype must be one of {GRAD_COMM_DTYPES}, got {dtype!r}")
  return jax.tree.map(lambda g: _sum_leaf(g, dtype, axis_name), grads)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def sum_in_backward(tree, dtype: str, axis_name: str):
  """The identity on ``tree``; in the backward pass each cotangent leaf is summed over the devices of mesh axis
  ``axis_name``, communicated in ``dtype`` (float32 or bfloat16, as :func:`all_reduce_sum`: elementwise, so summing
  a block's slice where it is made gives that slice of the sum of the whole stacked gradient). Call inside
  ``jax.shard_map``; ``model.Llama(block_grad_sum=...)`` applies it to each block's parameters."""
  return tree


def _sum_in_backward_fwd(tree, dtype, axis_name):
  return tree, None


def _sum_in_backward_bwd(dtype, axis_name, _, cotangents):
  return (jax.tree.map(lambda g: _sum_leaf(g, dtype, axis_name).astype(g.dtype), cotangents),)


sum_in_backward.defvjp(_sum_in_backward_fwd, _sum_in_backward_bwd)


def block_grad_sum(dtype: str, axis_name: str = DATA) -> Callable:
  """The ``model.Llama.block_grad_sum`` of a data-parallel step whose gradients travel in ``dtype``.

  Raises:
    ValueError: ``dtype`` not float32 or bfloat16 (float8's shared scale is a per-tensor amax: summing each
      block's slice would scale it by that slice's amax instead of the stacked tensor's).
  """
  if dtype not in PER_BLOCK_SUM_DTYPES:
    raise ValueError(f"per-block gradient sums take float32 or bfloat16 gradients, got {dtype!r}")
  return functools.partial(sum_in_backward, dtype=dtype, axis_name=axis_name)


def token_sharded_model(model: model_lib.Llama):
  """``model`` with the projections of its FP4 layer stacks running ``fp4jax.sharding.token_sharded(recipe,
  "data")`` (``fp4jax.flax.linen.quantize`` rules on the stacks' paths; BF16 stacks, embedding and LM head as
  written), with the model's ``quantizer_backend`` (the kernels quantize each token shard with the collective amax):
  inside :func:`data_parallel_value_and_grad` every quantized operand is then the one-device operand."""
  cfg = model.config
  stacks = [s for s in model_lib.layer_stacks(cfg) if s.recipe != model_lib.BF16_RECIPE]
  if not stacks:
    return model
  if cfg.num_experts:
    raise ValueError(
      f"num_experts={cfg.num_experts} with recipe {cfg.recipe!r}: --grad-comm-dtype other than float32 needs "
      "token-sharded recipes, which fp4jax.ragged_dot (the MoE experts) does not take; use float32"
    )
  recipe = fp4jax.sharding.token_sharded(cfg.recipe, DATA)
  rules = [fp4jax.flax.Rule(re.escape(s.name) + "/.*", recipe) for s in stacks]
  return fp4jax.flax.quantize(model, rules, defaults=(), backend=cfg.quantizer_backend)


def gather_params(params, param_specs):
  """Inside ``jax.shard_map``: each parameter leaf all-gathered (exact) along the dim its ``PartitionSpec`` in
  ``param_specs`` shards over "data" (FSDP), so that a data shard holds it whole there; dims sharded over "model"
  stay this device's slice; leaves not sharded over "data" as they are."""

  def gather(x, spec):
    dim = _sharded_dim(spec, DATA)
    return x if dim is None else lax.all_gather(x, DATA, axis=dim, tiled=True)

  return jax.tree.map(gather, params, param_specs, is_leaf=lambda x: isinstance(x, P))


def data_parallel_value_and_grad(
  loss_share: Callable, mesh: Mesh, comm_dtype: str, param_specs=None, summed: Collection[str] = ()
):
  """``(params, batch, key) -> (loss, grads)`` for ``jax.jit``: each data shard differentiates its share of the
  loss, ``loss_share(params, rows, key, total_rows)`` (the sum of its rows' losses divided by what the global
  mean divides by, e.g. ``total_rows · seq``), under ``jax.shard_map``; the shares' gradients are summed by
  :func:`all_reduce_sum` in ``comm_dtype``, the loss by an fp32 ``psum``. Parameters replicated, batch
  ``P("data", None)``, key replicated. With ``param_specs`` (FSDP: a ``PartitionSpec`` per parameter leaf, some
  sharded over "data"), the parameters come in sharded, each shard all-gathers them whole (exact) before its
  forward, and their gradients leave reduce-scattered in ``comm_dtype`` (:func:`reduce_gradients`): the same
  values as the all-reduced ones, each device keeping its slice.

  Each shard's backward then starts from the global program's cotangent (1/(B·T) per token, not 1/(B/n·T)),
  every shard uses the same key, and the model's FP4 dots must run token-sharded recipes
  (:func:`token_sharded_model`), so each quantized operand is bit-identical to one device's: the NVFP4 tensor amax
  is reduced over the shards and random bits follow global token indices (``fp4jax.sharding``). What differs from
  the global program is the order of the sums over tokens (each shard's fp32 wgrad partial sum and its rounding to
  the GEMM's bf16 input dtype, the all-reduce) and the deliberate rounding of the communicated gradient.

  ``summed``: the top-level parameter names (layer stacks) whose gradients ``loss_share``'s model already sums over
  "data" in its backward pass (:func:`block_grad_sum`); they are left out of the sum after it. Not with FSDP.

  Raises:
    ValueError: ``summed`` with ``param_specs``, or (at trace time) naming no top-level parameter.
  """
  if summed and param_specs is not None:
    raise ValueError("summed: per-block gradient sums are all-reduces; with FSDP (param_specs) they reduce-scatter")

  def local(params, batch, key):
    total_rows = batch.shape[0] * lax.axis_size(DATA)
    if param_specs is not None:
      params = gather_params(params, param_specs)
    loss, grads = jax.value_and_grad(loss_share)(params, batch, key, total_rows)
    if unknown := sorted(set(summed) - grads.keys()):
      raise ValueError(f"summed names {unknown}, which are not top-level parameters (have {sorted(grads)})")
    if param_specs is None:
      rest = all_reduce_sum({k: g for k, g in grads.items() if k not in summed}, comm_dtype, DATA)
      grads = {k: g if k in summed else rest[k] for k, g in grads.items()}
    else:
      grads = reduce_gradients(grads, param_specs, comm_dtype, DATA)
    return lax.psum(loss, DATA), grads

  # check_vma=False: the FP4 kernels' pallas_call outputs carry no varying-axes type; and without the check the
  # replicated parameters' gradients get no implicit fp32 psum in the transpose: each shard keeps its own, which
  # all_reduce_sum then sums in comm_dtype (and the psum'd loss and all-reduced sums are the same on every device)
  specs = P() if param_specs is None else param_specs
  in_specs, out_specs = (specs, P(DATA, None), P()), (P(), specs)
  return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


_COLLECTIVE = re.compile(r"= (.*?) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(")


def collective_dtypes(hlo_text: str) -> dict[str, set[str]]:
  """Element types moved by each kind of collective in a compiled HLO module (``jit(f).lower(...).compile()
  .as_text()``), e.g. ``{"all-reduce": {"f32"}}``: how to check that gradients are all-reduced in fp32."""
  found: dict[str, set[str]] = {}
  for shapes, op in _COLLECTIVE.findall(hlo_text):
    found.setdefault(op, set()).update(re.findall(r"\b([a-z]+[0-9]+[a-z0-9]*)\[", shapes))
  return found


def initialize_distributed(coordinator: str | None, num_processes: int | None, process_id: int | None) -> None:
  """``jax.distributed.initialize`` for multi-host training (one process per host, or per GPU).

  Every process gets the same ``coordinator`` ("host:port" of process 0), ``num_processes`` and its own
  ``process_id``; on clusters JAX can detect all three (SLURM, Open MPI, TPU pods), so None leaves them to it.
  Must run before any other JAX call in the process.
  """
  jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
