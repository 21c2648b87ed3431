"""``fp4jax.dot_general`` inside ``jax.shard_map`` with the numerics of the logical (unsharded) program.

Under ``shard_map`` each device runs the dot on its slice of the tokens (data parallelism), so a quantizer would see
only its shard: the NVFP4 tensor amax of the activation-like operands (X, dY, and the wgrad operands dYᵀ, Xᵀ, whose
contraction axis is the tokens) would be per shard, and random bits would hash shard-local element indices.
``token_sharded(recipe, axis_name)`` marks a recipe as running there; ``fp4jax.dot_general`` (and any Flax layer
that takes a recipe: the mark travels with the ``Recipe`` object) then quantizes every operand whose token axis is
split exactly as one device quantizes the logical tensor:

* NVFP4 tensor amax: the local max|x| (+Inf if the shard holds NaN/Inf: XLA's max, and so ``pmax``, may drop NaN,
  no max drops +Inf), ``lax.pmax`` over ``axis_name``, and NaN if that is not finite; a max is exact in any order,
  so this is the logical tensor's amax (and its NaN rule: ``fp4jax.quantize.quantize_blocks``).
* Random bits (stochastic rounding per element, MS-EDEN per scale): ``fp4jax.bits`` hashes of the element's (the
  scale's) logical row-major index, from the shard's origin ``lax.axis_index(axis_name) · local length`` along the
  token axis. Keys, Hadamard signs included, must be the same on every shard: do not fold the shard index in.
* Blocks and Hadamard chunks along the tokens (the wgrad GEMM's contraction axis) must not straddle devices: the
  local token count must be a multiple of lcm(block, Hadamard size) (16x16 tiles: of 16 along any token axis),
  else ``ValueError``. Blocks along the features are whole on every device.

Contract (what ``shard_map`` with ``in_specs=P(axis_name, ...)`` on the lhs's leading free dim gives): the lhs's
leading non-contracting, non-batch dim is this device's slice, device ``i = lax.axis_index(axis_name)`` holding
slice ``i`` of equal slices; the rhs (weights) is the same on every device. The canonical operands of
``fp4jax.dot`` then hold the tokens contiguously on dim 1 (X (B, M, K), dY (B, M, N)) or dim 2 (dYᵀ (B, N, M),
Xᵀ (B, K, M)). Only the fp32 sums over tokens (the wgrad GEMM's partial sums, reduced by the caller) differ from one
device.

Not supported on a token-sharded operand (``ValueError``): FP8 (its per-tensor current scale, ``fp4jax.fp8``, takes
no cross-shard amax), and per-row E2M1 scales or OCC clipping along the tokens; the ``"pallas"`` quantizer backend
(``"auto"`` uses XLA); the per-shard kernel with a collective amax is ``fp4jax_kernels.quantize.sharded``.

``ordered_psum`` is the all-reduce for sums that must not depend on the layout: ``lax.psum`` adds the shards in an
order the backend picks (a ring or a tree, by message size), ``ordered_psum`` always by the pairwise tree of
``fp4jax.reductions``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax

from fp4jax import recipes as recipes_lib
from fp4jax.reductions import leading_pairwise_sum
from fp4jax.formats import FP4Format
from fp4jax.recipes import E2M1_CHANNEL, FP8_FORMATS, OperandSpec, Recipe

# The dim holding the tokens in each activation-like operand of fp4jax.dot's canonical form (the weight-like
# operands fwd_rhs, dgrad_rhs are the same on every device).
TOKEN_DIMS = {"fwd_lhs": 1, "dgrad_lhs": 1, "wgrad_lhs": 2, "wgrad_rhs": 2}


@dataclasses.dataclass(frozen=True)
class TokenShardedRecipe(Recipe):
  """A ``Recipe`` whose dots run inside ``shard_map`` with the tokens split over mesh axis ``token_axis``."""

  token_axis: str = ""

  def __post_init__(self):
    super().__post_init__()
    if not isinstance(self.token_axis, str) or not self.token_axis:
      raise ValueError(f"TokenShardedRecipe.token_axis must be a mesh axis name, got {self.token_axis!r}")


def token_sharded(recipe: str | Recipe, axis_name: str) -> TokenShardedRecipe:
  """``recipe`` (a name or ``Recipe``) marked as running under ``shard_map`` with tokens split over ``axis_name``."""
  base = recipes_lib.get(recipe)
  return TokenShardedRecipe(**{f.name: getattr(base, f.name) for f in dataclasses.fields(Recipe)},
                            token_axis=axis_name)


def global_amax(x: jax.Array, axis_name: str) -> jax.Array:
  """max|x| over the shards of ``x`` along mesh axis ``axis_name`` (fp32), NaN if any shard holds NaN/Inf.

  Each shard sends its max|x|, or +Inf if it holds NaN/Inf (XLA's max, and so ``lax.pmax``, may drop NaN; no max
  drops +Inf); a max is exact in any order, so the result is the logical tensor's amax.
  """
  x = x.astype(jnp.float32)
  local = jnp.where(jnp.all(jnp.isfinite(x)), jnp.max(jnp.abs(x)), jnp.float32(jnp.inf))
  total = lax.pmax(local, axis_name)
  return jnp.where(jnp.isfinite(total), total, jnp.float32(jnp.nan))


def ordered_psum(x: jax.Array, axis_name: str) -> jax.Array:
  """Σ_i x_i over the devices i of mesh axis ``axis_name`` (a power-of-two count n), added by the balanced tree
  ``fp4jax.reductions.leading_pairwise_sum`` over device order: the same bits on every device, and the bits one
  device gets from ``leading_pairwise_sum`` of the stacked ``x_i``.

  Communication is a reduce-scatter and an all-gather, the bytes of a ring all-reduce: ``x`` is flattened, padded
  with zeros to n equal chunks, ``lax.all_to_all`` gives device j chunk j of every device, device j adds those n
  chunks by the tree, and ``lax.all_gather`` joins the n summed chunks. Call inside ``jax.shard_map``.
  """
  n = lax.axis_size(axis_name)
  if n & (n - 1):
    raise ValueError(f"ordered_psum: mesh axis {axis_name!r} has {n} devices, expected a power of two")
  flat = x.reshape(-1)
  chunk = -(-flat.size // n)
  chunks = jnp.pad(flat, (0, n * chunk - flat.size)).reshape(n, chunk)
  received = lax.all_to_all(chunks, axis_name, 0, 0, tiled=True)  # row i: chunk j of device i
  total = lax.all_gather(leading_pairwise_sum(received), axis_name, tiled=True)
  return total[:flat.size].reshape(x.shape)


@dataclasses.dataclass(frozen=True)
class OperandShard:
  """A GEMM operand whose dim ``dim`` is this device's slice of a logical dim split evenly over ``axis_name``."""

  axis_name: str
  dim: int

  def placement(self, shape: tuple[int, ...]) -> tuple[tuple, tuple[int, ...]]:
    """(origin, logical shape) of a local array of ``shape``: where its element 0 sits in the logical tensor."""
    logical, origin = list(shape), [0] * len(shape)
    logical[self.dim] *= lax.axis_size(self.axis_name)
    origin[self.dim] = lax.axis_index(self.axis_name) * shape[self.dim]
    return tuple(origin), tuple(logical)

  def global_amax(self, x: jax.Array) -> jax.Array:
    """max|x| over the logical tensor, NaN if any shard holds NaN/Inf (:func:`global_amax`)."""
    return global_amax(x, self.axis_name)

  def check(self, shape: tuple[int, ...], spec: OperandSpec, what: str) -> None:
    """ValueError unless ``spec`` quantizes a local operand of ``shape`` (quantized along its last dim) exactly as the
    logical tensor: no straddling block / Hadamard chunk, no per-tensor or per-row statistic across shards."""
    along = self.dim == len(shape) - 1  # the tokens are this operand's contraction (quantized) axis
    n = shape[self.dim]
    head = f"{what}: token-sharded operand of local shape {shape} (tokens on dim {self.dim}, split over {self.axis_name!r})"
    if spec.fmt in FP8_FORMATS:
      raise ValueError(f"{head}: {spec.fmt} has one per-tensor scale, which fp4jax.fp8 computes from the local shard "
                       "only; use an FP4 recipe or the fp32 global program")
    if along and (spec.fmt == E2M1_CHANNEL or spec.clip != "none"):
      raise ValueError(f"{head}: per-row {'E2M1 scales' if spec.fmt == E2M1_CHANNEL else 'OCC quantiles'} along the "
                       "tokens would need a cross-shard reduction, which is not implemented")
    units = []
    if along:
      if isinstance(spec.fmt, FP4Format):
        units.append(("block", spec.block_shape[1] if spec.block_shape else spec.fmt.block_size))
      if spec.hadamard:
        units.append(("Hadamard size", spec.hadamard))
    elif spec.block_shape is not None and self.dim == len(shape) - 2:
      units.append(("16x16 tile height", spec.block_shape[0]))
    unit = math.lcm(*(u for _, u in units)) if units else 1
    if n % unit:
      names = ", ".join(f"{name} {u}" for name, u in units)
      raise ValueError(f"{head}: {n} local tokens are not a multiple of lcm({names}) = {unit}, so a block or "
                       "Hadamard chunk would straddle two devices; use fewer shards or more tokens per shard")


def operand_shard(recipe: Recipe, operand: str) -> OperandShard | None:
  """The token shard of ``operand`` ("fwd_lhs", ..., "wgrad_rhs") of ``fp4jax.dot``'s canonical form under
  ``recipe``: None unless ``recipe`` is token-sharded and the operand holds tokens."""
  if not isinstance(recipe, TokenShardedRecipe) or operand not in TOKEN_DIMS:
    return None
  return OperandShard(recipe.token_axis, TOKEN_DIMS[operand])
