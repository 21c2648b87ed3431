"""``fp4jax.dot_general`` inside ``jax.shard_map`` with the numerics of the logical (unsharded) program.

Inside ``shard_map`` each device runs the dot on its slice of one or more GEMM axes: the tokens M (data
parallelism), the outputs N (Megatron's column-parallel layers: q, k, v, gate, up) or the inputs K (row-parallel: o,
down), each over its own mesh axis. A quantizer would then see only its shard: the NVFP4 tensor amax would be per
shard, and random bits would hash shard-local element indices. ``sharded(recipe, axis_name, split)``
(``token_sharded`` for the tokens) marks a recipe as running there, and marks compose (tokens over "data" and
outputs over "model": data parallelism beside Megatron's); ``fp4jax.dot_general`` (and any Flax layer that takes a
recipe: the mark travels with the ``Recipe`` object) then quantizes every operand that the splits cut exactly as
one device quantizes the logical tensor:

* NVFP4 tensor amax: the local max|x| (+Inf if the shard holds NaN/Inf: XLA's max, and so ``pmax``, may drop NaN,
  no max drops +Inf), ``lax.pmax`` over the mesh axes that cut the operand, and NaN if that is not finite; a max is
  exact in any order, so this is the logical tensor's amax (and its NaN rule: ``fp4jax.quantize.quantize_blocks``).
* Random bits (stochastic rounding per element, MS-EDEN per scale): ``fp4jax.bits`` hashes of the element's (the
  scale's) logical row-major index, from the shard's origin ``lax.axis_index(axis_name) · local length`` along the
  split dim. Keys, Hadamard signs included, must be the same on every shard: do not fold the shard index in.
* Blocks and Hadamard chunks along a split contraction axis (the tokens of the wgrad GEMM, the outputs of the
  dgrad GEMM, the inputs of the forward GEMM) must not straddle devices: the local length must be a multiple of
  lcm(block, Hadamard size), and of 16 along any split axis of a 16x16-tiled operand, else ``ValueError``.

Contract (what ``shard_map`` with the split dim's spec gives, or ``jax.vmap`` with ``axis_name``): the split dim of
the lhs (tokens, inputs) and of the rhs (outputs, inputs) is this device's slice, device
``i = lax.axis_index(axis_name)`` holding slice ``i`` of equal slices; every other operand dim is whole. Which dim
of each canonical operand a split cuts is :data:`SPLIT_DIMS`. The dot's result is then this device's slice of the
logical result, except for the sums over the split axis (the wgrad GEMM's over tokens, the dgrad GEMM's over outputs,
the forward GEMM's over inputs), which are partial sums that the caller adds across devices.

* FP8's per-tensor current scale takes the same cross-shard amax; Microsoft FP4's per-row E2M1 scales and its DGE
  take a per-row ``pmax`` when the split cuts the rows; its OCC clamp bounds (per-row quantiles) are taken from the
  whole rows, gathered from the shards (``lax.all_gather``, exact).

A sharded operand goes through ``fp4jax.operand.SHARDED_QUANTIZE_OP``: XLA, or the fused kernel on the local slice
(``fp4jax_kernels.operand.quantize_sharded_operand``, registered as "pallas") with the collective amax and the
slice's logical origin, the same bits. The kernels (also ``fp4jax_kernels.quantize.sharded`` for a whole sharded
array) run on this module's description of a sharded tensor: one :class:`OperandShard` per split dim (a mesh axis
or a tuple of axes), its :func:`placement` (origin and logical shape for the random bits), :func:`combine_amax` (the
collective NVFP4 amax) and ``OperandShard.check`` (no straddling block, Hadamard chunk or 16x16 tile); a
:class:`ShardedOperand` holds an operand's shards and takes the logical tensor's statistics from them.

``ordered_psum`` is the all-reduce for sums that must not depend on the layout: ``lax.psum`` adds the shards in an
order the backend picks (a ring or a tree, by message size), ``ordered_psum`` always by the pairwise tree of
``fp4jax.reductions``. ``copy_to_shards`` / ``sum_from_shards`` are Megatron's two conjugate tensor-parallel
operators (identity one way, that all-reduce the other) built on it.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from fp4jax._src import recipes as recipes_lib
from fp4jax._src.formats import BlockFormat
from fp4jax._src.ieee import widen
from fp4jax._src.recipes import OperandSpec, Recipe
from fp4jax._src.reductions import leading_pairwise_sum

# The dim of each operand of fp4jax.dot's canonical form (X (B, M, K), W (B, N, K); dgrad dY (B, M, N), Wᵀ (B, K, N);
# wgrad dYᵀ (B, N, M), Xᵀ (B, K, M)) that a split cuts; operands missing from a split are the same on every device.
SPLIT_DIMS = {
  "tokens": {"fwd_lhs": 1, "dgrad_lhs": 1, "wgrad_lhs": 2, "wgrad_rhs": 2},  # M: data parallelism
  "outputs": {"fwd_rhs": 1, "dgrad_lhs": 2, "dgrad_rhs": 2, "wgrad_lhs": 1},  # N: column-parallel (Megatron)
  "inputs": {"fwd_lhs": 2, "fwd_rhs": 2, "dgrad_rhs": 1, "wgrad_rhs": 1},  # K: row-parallel (Megatron)
}
AxisName = str | tuple[str, ...]  # a mesh axis, or several (major to minor: lax.axis_index's row-major order)


@dataclasses.dataclass(frozen=True)
class ShardedRecipe(Recipe):
  """A ``Recipe`` whose dots run inside ``shard_map`` (or ``jax.vmap`` with axis names) with GEMM axes split over
  mesh axes: ``splits`` holds one ``(split, axis)`` pair per split GEMM axis, ``split`` being "tokens" (M),
  "outputs" (N) or "inputs" (K) and ``axis`` a mesh axis name; each split and each axis appears at most once (data
  parallelism with Megatron tensor parallelism: tokens over "data" and outputs or inputs over "model")."""

  splits: tuple[tuple[str, str], ...] = ()

  def __post_init__(self):
    super().__post_init__()
    if not isinstance(self.splits, tuple) or not self.splits:
      raise ValueError(f"ShardedRecipe.splits must be a non-empty tuple of (split, axis) pairs, got {self.splits!r}")
    for pair in self.splits:
      if not (isinstance(pair, tuple) and len(pair) == 2):
        raise ValueError(f"ShardedRecipe.splits: each entry must be a (split, axis) pair, got {pair!r}")
      split, axis = pair
      if split not in SPLIT_DIMS:
        raise ValueError(f"ShardedRecipe.splits: split must be one of {tuple(SPLIT_DIMS)}, got {split!r}")
      if not isinstance(axis, str) or not axis:
        raise ValueError(f"ShardedRecipe.splits: the {split} split's axis must be a mesh axis name, got {axis!r}")
    for what, names in (("split", [p[0] for p in self.splits]), ("mesh axis", [p[1] for p in self.splits])):
      twice = sorted({n for n in names if names.count(n) > 1})
      if twice:
        raise ValueError(f"ShardedRecipe.splits {self.splits!r}: {what} {twice[0]!r} appears twice")


def sharded(recipe: str | Recipe, axis_name: str, split: str) -> ShardedRecipe:
  """``recipe`` marked as running with one more GEMM axis cut into equal contiguous slices over ``axis_name``.

  ``split`` is "tokens" (the lhs's leading free dim, data parallelism), "outputs" (the rhs's free dims,
  column-parallel) or "inputs" (the contracting dims, row-parallel); device ``lax.axis_index(axis_name)`` holds its
  slice. The dot's own output is then this device's slice (tokens, outputs) or partial sum (inputs: the caller adds
  the partials, e.g. by :func:`sum_from_shards`). A ``recipe`` that is already a :class:`ShardedRecipe` keeps its
  splits and gains this one: ``sharded(token_sharded(r, "data"), "model", "outputs")`` is a column-parallel layer
  under data parallelism.

  Args:
    recipe: a recipe name (``fp4jax.recipes.names()``) or a ``Recipe`` (a ``ShardedRecipe`` too).
    axis_name: the mesh axis name (a non-empty string) the split runs over.
    split: ``"tokens"``, ``"outputs"`` or ``"inputs"``.

  Returns:
    A ``ShardedRecipe`` with ``recipe``'s fields and splits, and ``(split, axis_name)`` last.

  Raises:
    ValueError: an unknown recipe name, an empty or non-string ``axis_name``, an unknown ``split``, or a split or
      axis that ``recipe`` already has.
  """
  base = recipes_lib.get(recipe)
  earlier = base.splits if isinstance(base, ShardedRecipe) else ()
  fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(Recipe)}
  return ShardedRecipe(**fields, splits=(*earlier, (split, axis_name)))


def token_sharded(recipe: str | Recipe, axis_name: str) -> ShardedRecipe:
  """``recipe`` marked as running under ``shard_map`` with the tokens split over ``axis_name``.

  Args:
    recipe: a recipe name or a ``Recipe``.
    axis_name: the mesh axis name the tokens are split over.

  Returns:
    ``sharded(recipe, axis_name, "tokens")``.

  Raises:
    ValueError: as ``sharded``.
  """
  return sharded(recipe, axis_name, "tokens")


def combine_amax(local: jax.Array, axis_name: AxisName) -> jax.Array:
  """The logical tensor's amax from each shard's ``local`` max|x|: NaN if any shard holds NaN/Inf.

  Each shard sends ``local``, or +Inf where it is not finite (XLA's max, and so ``lax.pmax``, may drop NaN; no max
  drops +Inf); a max is exact in any order, so the result is the logical tensor's amax (``fp4jax.quantize``'s NaN
  rule). Call inside ``jax.shard_map``; the per-shard kernels (``fp4jax_kernels.quantize.sharded``) call it on their
  kernel's local amax.

  Args:
    local: float32 array (a scalar, or per-row maxima): this shard's max|x|, NaN or +Inf for a shard holding NaN/Inf.
    axis_name: the mesh axis, or a tuple of axes, the tensor is split over.

  Returns:
    float32 array of ``local``'s shape, the same on every device: the maximum over the shards, NaN where not finite.
  """
  total = lax.pmax(jnp.where(jnp.isfinite(local), local, jnp.float32(jnp.inf)), axis_name)
  return jnp.where(jnp.isfinite(total), total, jnp.float32(jnp.nan))


def global_amax(x: jax.Array, axis_name: AxisName) -> jax.Array:
  """max|x| over the shards of ``x`` along mesh axis (or axes) ``axis_name`` (fp32), NaN if any shard holds NaN/Inf.

  :func:`combine_amax` of the local max|x|, +Inf for a shard with a non-finite element. Call inside
  ``jax.shard_map``.

  Args:
    x: this device's shard, any shape and float dtype.
    axis_name: the mesh axis, or a tuple of axes, the tensor is split over.

  Returns:
    float32 scalar, the same on every device.
  """
  x = widen(x)
  return combine_amax(jnp.where(jnp.all(jnp.isfinite(x)), jnp.max(jnp.abs(x)), jnp.float32(jnp.inf)), axis_name)


def ordered_psum(x: jax.Array, axis_name: str) -> jax.Array:
  """Σ_i x_i over the devices i of mesh axis ``axis_name``, added by a balanced tree in device order.

  The count n must be a power of two; the tree is ``fp4jax.reductions.leading_pairwise_sum``: the same bits on every
  device, and the bits one device gets from ``leading_pairwise_sum`` of the stacked ``x_i``.

  Communication is a reduce-scatter and an all-gather, the bytes of a ring all-reduce: ``x`` is flattened, padded
  with zeros to n equal chunks, ``lax.all_to_all`` gives device j chunk j of every device, device j adds those n
  chunks by the tree, and ``lax.all_gather`` joins the n summed chunks. Call inside ``jax.shard_map``.

  Args:
    x: this device's summand, any shape and dtype, the same shape on every device.
    axis_name: the mesh axis to sum over.

  Returns:
    Array of ``x``'s shape and dtype, the same on every device.

  Raises:
    ValueError: the axis has a device count that is not a power of two.
  """
  n = lax.axis_size(axis_name)
  if n & (n - 1):
    raise ValueError(f"ordered_psum: mesh axis {axis_name!r} has {n} devices, expected a power of two")
  flat = x.reshape(-1)
  chunk = -(-flat.size // n)
  chunks = jnp.pad(flat, (0, n * chunk - flat.size)).reshape(n, chunk)
  received = lax.all_to_all(chunks, axis_name, 0, 0, tiled=True)  # row i: chunk j of device i
  total = lax.all_gather(leading_pairwise_sum(received), axis_name, tiled=True)
  return total[: flat.size].reshape(x.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def copy_to_shards(x: jax.Array, axis_name: str) -> jax.Array:
  """Megatron's entry to a tensor-parallel region: ``x`` as is; its gradient is the sum of the devices' gradients.

  The backward sum is :func:`ordered_psum` (the same bits on every layout).

  Args:
    x: an array, the same on every device of ``axis_name``.
    axis_name: the mesh axis of the tensor-parallel region (not differentiated).

  Returns:
    ``x`` unchanged.
  """
  return x


def _copy_fwd(x, axis_name):
  return x, None


def _copy_bwd(axis_name, _, g):
  return (ordered_psum(g, axis_name),)


copy_to_shards.defvjp(_copy_fwd, _copy_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def sum_from_shards(x: jax.Array, axis_name: str) -> jax.Array:
  """Megatron's exit from a tensor-parallel region: Σ of the devices' partial results ``x`` by :func:`ordered_psum`.

  The gradient (the same on every device) passes to each partial as is.

  Args:
    x: this device's partial result.
    axis_name: the mesh axis to sum over (a power-of-two device count; not differentiated).

  Returns:
    Array of ``x``'s shape and dtype: the sum, the same on every device.

  Raises:
    ValueError: as ``ordered_psum``.
  """
  return ordered_psum(x, axis_name)


def _sum_fwd(x, axis_name):
  return ordered_psum(x, axis_name), None


def _sum_bwd(axis_name, _, g):
  return (g,)


sum_from_shards.defvjp(_sum_fwd, _sum_bwd)


@dataclasses.dataclass(frozen=True)
class OperandShard:
  """A GEMM operand whose dim ``dim`` is this device's slice of a logical dim split evenly over ``axis_name`` (a mesh
  axis, or a tuple of axes, major to minor); ``label`` names that dim in errors ("tokens", "outputs", "inputs")."""

  axis_name: AxisName
  dim: int
  label: str = "tokens"

  def check(self, shape: tuple[int, ...], spec: OperandSpec, what: str) -> None:
    """ValueError unless ``spec`` quantizes a local operand of ``shape`` (quantized along its last dim) exactly as the
    logical tensor: no straddling block / Hadamard chunk, no per-tensor or per-row statistic across shards."""
    along = self.dim == len(shape) - 1  # the split dim is this operand's contraction (quantized) axis
    n = shape[self.dim]
    head = f"{what}: operand of local shape {shape} sharded over {self.axis_name!r} ({self.label} on dim {self.dim})"
    units = []
    if along:
      if isinstance(spec.fmt, BlockFormat):
        units.append(("block", spec.block_shape[1] if spec.block_shape else spec.fmt.block_size))
      if spec.hadamard:
        units.append(("Hadamard size", spec.hadamard))
    elif spec.block_shape is not None and self.dim == len(shape) - 2:
      units.append((f"{spec.block_shape[0]}x{spec.block_shape[1]} tile height", spec.block_shape[0]))
    unit = math.lcm(*(u for _, u in units)) if units else 1
    if n % unit:
      names = ", ".join(f"{name} {u}" for name, u in units)
      raise ValueError(
        f"{head}: {n} local {self.label} are not a multiple of lcm({names}) = {unit}, so a block or "
        "Hadamard chunk would straddle two devices; use fewer shards or a larger split dim"
      )


@dataclasses.dataclass(frozen=True)
class ShardedOperand:
  """A GEMM operand that is one device's slice of a logical tensor, cut along each ``OperandShard.dim`` of
  ``shards`` (distinct dims: the tokens over one mesh axis and the outputs or inputs over another, say). Its
  methods are the logical tensor's statistics, which ``fp4jax.operand`` takes instead of the slice's."""

  shards: tuple[OperandShard, ...]

  def placement(self, shape: tuple[int, ...]) -> tuple[tuple, tuple[int, ...]]:
    """(origin, logical shape) of a local array of ``shape``: where its element 0 sits in the logical tensor."""
    return placement(self.shards, shape)

  def global_amax(self, x: jax.Array) -> jax.Array:
    """max|x| over the logical tensor, NaN if any shard holds NaN/Inf (:func:`global_amax` over every axis)."""
    return global_amax(x, mesh_axes(self.shards))

  def _row_axes(self, x: jax.Array) -> tuple[str, ...]:
    """The mesh axes that cut the rows of ``x``'s last (quantized) axis."""
    return mesh_axes(s for s in self.shards if s.dim == x.ndim - 1)

  def row_amax(self, x: jax.Array) -> jax.Array:
    """max|x| of each logical row along the last axis (keepdims, fp32), NaN for a row holding NaN/Inf when a split
    cuts the rows (:func:`combine_amax` per row over those axes); else the local rows' max."""
    local = jnp.max(jnp.abs(widen(x)), axis=-1, keepdims=True)
    axes = self._row_axes(x)
    if not axes:
      return local
    finite = jnp.all(jnp.isfinite(x), axis=-1, keepdims=True)
    return combine_amax(jnp.where(finite, local, jnp.float32(jnp.inf)), axes)

  def whole_rows(self, x: jax.Array) -> jax.Array:
    """The logical rows of ``x`` along its last axis: ``lax.all_gather`` of the shards when a split cuts them
    (exact), else ``x``."""
    axes = self._row_axes(x)
    return lax.all_gather(x, axes, axis=x.ndim - 1, tiled=True) if axes else x

  def check(self, shape: tuple[int, ...], spec: OperandSpec, what: str) -> None:
    """``OperandShard.check`` of each split dim."""
    for shard in self.shards:
      shard.check(shape, spec, what)


def mesh_axes(shards) -> tuple[str, ...]:
  """The mesh axes of ``shards`` (``OperandShard``s, each naming one axis or a tuple of them), in order: the axes a
  tensor split as ``shards`` say is combined over (``combine_amax``)."""
  return tuple(name for s in shards for name in ((s.axis_name,) if isinstance(s.axis_name, str) else s.axis_name))


def placement(shards, shape: tuple[int, ...]) -> tuple[tuple, tuple[int, ...]]:
  """(origin, logical shape) of a local array of ``shape`` whose dims ``s.dim`` are split as ``shards`` say.

  At most one ``OperandShard`` per dim: dim ``d`` of the logical tensor is ``shape[d]`` times the devices of its
  axes, and this device's slice starts at ``lax.axis_index(axes) · shape[d]``. Call inside ``jax.shard_map``.

  Args:
    shards: an iterable of ``OperandShard`` (each with ``axis_name`` and ``dim``).
    shape: the local array's shape.

  Returns:
    ``(origin, logical_shape)``: a tuple of one (possibly traced) int per dim and a tuple of ints, as
    ``fp4jax.bits.random_bits`` takes them.
  """
  logical, origin = list(shape), [0] * len(shape)
  for s in shards:
    logical[s.dim] *= lax.axis_size(s.axis_name)
    origin[s.dim] = lax.axis_index(s.axis_name) * shape[s.dim]
  return tuple(origin), tuple(logical)


def operand_shard(recipe: Recipe, operand: str) -> ShardedOperand | None:
  """The sharding of ``operand`` ("fwd_lhs", ..., "wgrad_rhs") of ``fp4jax.dot``'s canonical form under ``recipe``:
  None unless ``recipe`` is a :class:`ShardedRecipe` one of whose splits cuts the operand."""
  if not isinstance(recipe, ShardedRecipe):
    return None
  shards = tuple(
    OperandShard(axis, SPLIT_DIMS[split][operand], split)
    for split, axis in recipe.splits
    if operand in SPLIT_DIMS[split]
  )
  return ShardedOperand(shards) if shards else None
