"""``dot_general`` and ``einsum`` whose forward and backward GEMMs are quantized as a ``Recipe`` prescribes.

Any ``dimension_numbers`` are canonicalized into a batched 2D problem ``X (B, M, K)`` x ``W (B, N, K)`` (batch dims
first, free dims flattened, contracting dims flattened last; JAX differentiates the transposes and reshapes), and a
``jax.custom_vjp`` runs the three GEMMs, each quantizing both operands along its own contraction axis:

    fwd    Y  = Q(X)  · Q(W)ᵀ       contraction K (features)
    dgrad  dX = Q(dY) · Q(Wᵀ)ᵀ      contraction N (outputs)
    wgrad  dW = Q(dYᵀ)· Q(Xᵀ)ᵀ      contraction M (tokens)

A GEMM with a Hadamard rotates both operands along its contraction axis with the same signs, so the rotation cancels.
A contraction length that is not a multiple of the Hadamard size d is zero-padded at its end to one (``_pad_chunks``)
in both operands before rotating: zeros add nothing to the product and the rotation is orthogonal on the padded
length, so the rotation still cancels and an unbiased quantizer keeps the GEMM unbiased; the rotated padding is
quantized as part of the rotated vector and the contraction sums over it. A forward rotation's gradient is cropped
back to the input's length after its inverse rotation. (Partial quantization blocks are zero-padded by
``fp4jax.quantize``.) ``Recipe.shape_rules`` lists these units; under ``fp4jax.sharding`` the split dim's local
length must hold whole units, which ``dot_general`` checks when the forward is traced.
When the backward re-uses the forward-quantized W (or X) (``OperandSpec.source="forward"``), its GEMM yields the
gradient of the forward-quantized operand, which the forward operand's estimator (straight-through or trust mask)
and the inverse forward rotation map back to the input; DGE multiplies the weight gradient by its derivative.

On a Pallas backend, X (forward and wgrad), W (forward and dgrad, where the dgrad quantizes W itself) and dY
(dgrad and wgrad) are each quantized for both of their GEMMs by one kernel where that pays
(``fp4jax.operand.rotate_and_quantize_both``); X's wgrad and W's dgrad operand are then quantized in the forward
and kept instead of X and W. Same bits as quantizing each operand in its own GEMM.

A weight quantized once for many calls (``prequantize_weight``: a layer loop's stacked weights quantized for all
layers before the loop, under ``jax.vmap``) is passed as ``dot_general(..., rhs_prequantized=...)``: the GEMMs read
its operands instead of quantizing W, the same bits, and W's gradient is unchanged (the weight-gradient GEMM does
not read W). Only recipes whose W operands are drawn without randomness or sums can be prequantized
(``prequantize_refusal``).

Randomness: one ``key`` per call, split by ``jax.random.fold_in`` with a fixed id per operand (and one per signs
draw: the forward GEMM's, and one shared by the two backward GEMMs); the same key gives the same result.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fp4jax._src import backends as backends_lib
from fp4jax._src import checks, estimators
from fp4jax._src import recipes as recipes_lib
from fp4jax._src import sharding as sharding_lib
from fp4jax._src.backends import Backend
from fp4jax._src.ieee import widen
from fp4jax._src.operand import (
  Operand,
  channel_scale,
  inverse_rotate,
  matmul,
  rotate_and_quantize,
  rotate_and_quantize_both,
)
from fp4jax._src.recipes import Recipe

_KEY_IDS = {"fwd_lhs": 1, "fwd_rhs": 2, "dgrad_lhs": 3, "dgrad_rhs": 4, "wgrad_lhs": 5, "wgrad_rhs": 6}
_SIGNS_IDS = {"fwd": 7, "bwd": 8}


def _derive_keys(key):
  """The call's keys ``fold_in(key, i)`` for every id of ``_KEY_IDS`` and ``_SIGNS_IDS`` (1..8), as one batch: one
  vectorized threefry instead of one per operand and signs draw, the same keys (None without a key)."""
  if key is None:
    return None
  ids = jnp.arange(1, len(_KEY_IDS) + len(_SIGNS_IDS) + 1, dtype=jnp.uint32)
  return jax.vmap(jax.random.fold_in, (None, 0))(key, ids)


def _fold(keys, idx: int):
  """``fold_in(key, idx)`` from the batch ``_derive_keys(key)`` (None without a key)."""
  return None if keys is None else keys[idx - 1]


def _bwd_signs(r: Recipe, keys) -> tuple:
  """The backward GEMMs' sign vectors (dY's for the data gradient, for the weight gradient), both drawn from the key
  ``fold_in(key, _SIGNS_IDS["bwd"])``: drawn once where the two rotate alike (the same vector either way; each draw
  is a threefry call, 20 rounds unrolled in a GPU's HLO)."""
  bwd_key = _fold(keys, _SIGNS_IDS["bwd"])
  dgrad = r.dgrad_lhs.sign_vector(bwd_key)
  alike = (r.wgrad_lhs.hadamard, r.wgrad_lhs.signs) == (r.dgrad_lhs.hadamard, r.dgrad_lhs.signs)
  return dgrad, dgrad if alike else r.wgrad_lhs.sign_vector(bwd_key)


# ------------------------------------------------------------------------------------------------ canonical form
@dataclasses.dataclass(frozen=True)
class _Canonical:
  lhs_perm: tuple[int, ...]
  rhs_perm: tuple[int, ...]
  bmk: tuple[int, int, int]
  bnk: tuple[int, int, int]
  out_shape: tuple[int, ...]
  dimension_numbers: tuple  # with non-negative dims, as lax.dot_general wants
  dims: dict  # recipes.DIMS name -> ("lhs" or "rhs", the user's dims making up M, N or K)


def _unpack(dimension_numbers) -> tuple:
  """``(lhs_contracting, rhs_contracting, lhs_batch, rhs_batch)`` of ``dimension_numbers``, or a ValueError."""
  try:
    (lc, rc), (lb, rb) = dimension_numbers
  except (TypeError, ValueError):
    raise ValueError(
      "dimension_numbers must be ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)), "
      f"got {dimension_numbers!r}"
    ) from None
  return lc, rc, lb, rb


def _side_dims(shape, dimension_numbers, side: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
  """Operand ``side``'s (``"lhs"`` or ``"rhs"``) ``(contracting, batch, free)`` dims, non-negative, or a
  ValueError."""
  lc, rc, lb, rb = _unpack(dimension_numbers)
  contracting, batch = (lc, lb) if side == "lhs" else (rc, rb)
  contracting, batch = (tuple(_axis(d, len(shape), side) for d in dims) for dims in (contracting, batch))
  if len(set(contracting + batch)) != len(contracting + batch):
    raise ValueError(f"dimension_numbers repeat a {side} dimension: {dimension_numbers!r}")
  return contracting, batch, tuple(d for d in range(len(shape)) if d not in contracting + batch)


def _size(shape, dims) -> int:
  return math.prod(shape[d] for d in dims)


def _canonicalize(lhs_shape, rhs_shape, dimension_numbers) -> _Canonical:
  lc, rc, lb, rb = _unpack(dimension_numbers)
  if len(lc) != len(rc) or len(lb) != len(rb):
    raise ValueError(f"dimension_numbers pair unequal numbers of lhs/rhs dims: {dimension_numbers!r}")
  lc, lb, lf = _side_dims(lhs_shape, dimension_numbers, "lhs")
  rc, rb, rf = _side_dims(rhs_shape, dimension_numbers, "rhs")
  for l, r in zip(lc + lb, rc + rb):
    if lhs_shape[l] != rhs_shape[r]:
      raise ValueError(f"lhs dim {l} (size {lhs_shape[l]}) and rhs dim {r} (size {rhs_shape[r]}) must match")
  b, m, n, k = _size(lhs_shape, lb), _size(lhs_shape, lf), _size(rhs_shape, rf), _size(lhs_shape, lc)
  out_shape = tuple(lhs_shape[d] for d in lb + lf) + tuple(rhs_shape[d] for d in rf)
  dims = {"tokens": ("lhs", lf), "outputs": ("rhs", rf), "inputs": ("lhs", lc)}
  return _Canonical(lb + lf + lc, rb + rf + rc, (b, m, k), (b, n, k), out_shape, ((lc, rc), (lb, rb)), dims)


def _dim_label(dim: str, side: str, dims: tuple[int, ...], labels) -> str:
  """The user's name of canonical dim ``dim`` (M, N or K): its lhs/rhs dims, or einsum letters when ``labels``."""
  where = (
    f"{'ab'[side == 'rhs']}'s {''.join(labels[side == 'rhs'][d] for d in dims)!r}" if labels else f"{side} dims {dims}"
  )
  return f"{dim} ({where})"


def _check_shapes(recipe: Recipe, lhs, rhs, canon: _Canonical, fn: str, labels) -> None:
  """At trace time of the forward: no empty operand, and under ``fp4jax.sharding`` every ``Recipe.shape_rules``
  rule of the split dim holds for the local length (else a block or Hadamard chunk of some GEMM, forward or
  backward, would straddle two devices)."""
  for name, a in zip(("a", "b") if labels else ("lhs", "rhs"), (lhs, rhs)):
    if a.size == 0:
      raise ValueError(
        f"{fn}(recipe={recipe.name!r}): {name} of shape {a.shape} is empty; quantizing needs at least "
        "one element (its amax and block scales)"
      )
  if not isinstance(recipe, sharding_lib.ShardedRecipe):
    return  # on one device a ragged dim is zero-padded (blocks: fp4jax.quantize; Hadamard chunks: _pad_chunks)
  sizes = dict(zip(recipes_lib.DIMS, (canon.bmk[1], canon.bnk[1], canon.bmk[2])))
  axes = dict(recipe.splits)
  for rule in recipe.shape_rules:
    n = sizes[rule.dim]
    if rule.dim in axes and n % rule.multiple:
      raise ValueError(
        f"{fn}(recipe={recipe.name!r}): {_dim_label(rule.dim, *canon.dims[rule.dim], labels)} = {n} on each "
        f"device of {axes[rule.dim]!r} must be a multiple of {rule.multiple} for {rule.describe(recipe.name)}: "
        "a unit would straddle two devices; use fewer shards or a larger dim"
      )


def _axis(d: int, ndim: int, what: str) -> int:
  if not -ndim <= d < ndim:
    raise ValueError(f"dimension_numbers: {what} dimension {d} out of range for rank {ndim}")
  return d % ndim


# ------------------------------------------------------------------------------------------------ the custom VJP
class _Quantized(NamedTuple):
  """One GEMM operand after rotation and quantization."""

  operand: Operand  # the quantized values and their scale, as ``fp4jax.operand.matmul`` reads them
  mask: jax.Array | None  # the trust mask (``estimator="trust_mask"``): True where the input was not clipped; else None


class _Both(NamedTuple):
  """One tensor quantized by one kernel pass for two GEMMs (``_quantize_both``)."""

  rows: _Quantized  # quantized along its last axis (the ``rows`` operand, e.g. ``"fwd_lhs"``)
  cols: _Quantized  # quantized transposed, along its second-to-last axis (the ``cols`` operand, e.g. ``"wgrad_rhs"``)


class _Residuals(NamedTuple):
  """What the forward of ``_qdot`` keeps for its backward (a pytree: JAX saves the arrays, None is an empty leaf).

  Exactly one of ``x`` and ``xq`` is set (``wgrad_rhs.source`` ``"input"`` or ``"forward"``); ``w`` is set when the
  data-gradient GEMM quantizes W itself or the forward estimator is DGE (which reads W), ``wq`` when the data-gradient
  GEMM reuses the forward-quantized W.
  """

  x: jax.Array | Operand | None  # X (B, M, K), or its weight-gradient operand quantized in the forward pass
  w: jax.Array | Operand | None  # W (B, N, K), or its data-gradient operand quantized in the forward pass
  xq: Operand | None  # the forward-quantized X, for a weight-gradient GEMM with ``source="forward"``
  wq: Operand | None  # the forward-quantized W, for a data-gradient GEMM with ``source="forward"``
  mask_x: jax.Array | None  # X's forward trust mask (``estimator="trust_mask"``), else None
  mask_w: jax.Array | None  # W's forward trust mask, else None
  fwd_signs: jax.Array | None  # the forward GEMM's Hadamard sign vector (None without a Hadamard)
  keys: jax.Array | None  # the call's derived keys (``_derive_keys``): the backward's operands' keys and signs


@dataclasses.dataclass(frozen=True)
class _Static:
  recipe: Recipe
  precision: Any
  backend: str
  out_dtype: Any
  lhs_dtype: Any
  rhs_dtype: Any
  k: int | None = None  # K of the canonical X (B, M, K) and W (B, N, K), to crop ``_pad_chunks``; None: no crop
  # W is a layer stack's weight (prequantized): its quantizations take the kernels at any size under "auto"
  w_any_size: bool = False


@functools.partial(
  jax.tree_util.register_dataclass, data_fields=("fwd", "mask", "dgrad"), meta_fields=("recipe", "specs", "dtype")
)
@dataclasses.dataclass(frozen=True)
class PrequantizedWeight:
  """A weight-like ``rhs`` quantized ahead of the ``dot_general`` calls that use it (``prequantize_weight``).

  A pytree: ``jax.vmap`` of ``prequantize_weight`` over stacked weights gives one with a leading axis on every
  array, which ``jax.lax.scan`` slices per layer.

  Attributes:
    fwd: W (B, N, K) quantized for the forward GEMM (``recipe.fwd_rhs``; K zero-padded to whole Hadamard chunks).
    mask: its trust mask (``estimator="trust_mask"``, QuEST), else None.
    dgrad: Wᵀ quantized for the data-gradient GEMM (``recipe.dgrad_rhs``, quantized from the input), or None where
      that GEMM reuses ``fwd`` (``source="forward"``) or W's estimator is DGE (whose backward reads W itself, as the
      dot receives it).
    recipe: the name of the recipe it was quantized for (messages only).
    specs: ``(recipe.fwd_rhs, recipe.dgrad_rhs)``: a dot whose recipe quantizes W otherwise refuses it.
    dtype: the dtype of the ``rhs`` it was quantized from: a dot receiving ``rhs`` in another dtype (whose
      quantization could round differently) refuses it.
  """

  fwd: Operand
  mask: jax.Array | None
  dgrad: Operand | None
  recipe: str
  specs: tuple
  dtype: str


def prequantize_refusal(recipe: str | Recipe) -> str | None:
  """Why ``recipe``'s W operands cannot be quantized ahead of the GEMMs (``prequantize_weight``), or None.

  Prequantized W must be the bits each call would draw, whatever key it gets and however the weights are batched:
  W quantized in the forward (and, from the input, in the data-gradient GEMM) by round-to-nearest with one tensor
  amax, Hadamard signs that are not drawn (none, TE's or the fixed vector) and no clipping (no random bits; the
  quantizers' sums, such as Four Over Six's block errors or QuEST's block deviations, are in an order fp4jax fixes,
  which ``jax.vmap`` does not change), and one device's tensor (not ``fp4jax.sharding``'s slices, whose amax is a
  collective). A backward GEMM that re-quantizes the forward-quantized W (``source="forward"``) does so in the call,
  with its key; DGE's backward reads W itself, as the dot receives it.

  Args:
    recipe: a ``Recipe`` or registered name.

  Returns:
    None where ``prequantize_weight`` takes ``recipe``, else the reason it refuses it (naming the operand and field).
  """
  r = recipes_lib.get(recipe)
  if isinstance(r, sharding_lib.ShardedRecipe):
    return "a sharded recipe quantizes W's slices with a collective amax"
  if r.fwd_rhs.fmt is None:
    return "its forward GEMM does not quantize W"
  specs = [("fwd_rhs", r.fwd_rhs)] + ([("dgrad_rhs", r.dgrad_rhs)] if r.dgrad_rhs.source == "input" else [])
  for name, spec in specs:
    if spec.fmt is None:
      return f"{name} uses W unquantized"
    why = [
      field
      for field, refused in (
        (f"rounding={spec.rounding!r}", spec.rounding != "rtn"),
        (f"signs={spec.signs!r}", bool(spec.hadamard) and spec.signs == "random"),
        (f"clip={spec.clip!r}", spec.clip != "none"),
        (f"amax={spec.amax!r}", spec.amax != "tensor"),
      )
      if refused
    ]
    if why:
      reason = ", ".join(why)
      return f"{name} quantizes W with {reason} (prequantized W needs rtn, signs not drawn, no clip, a tensor amax)"
  return None


def prequantize_weight(
  rhs: jax.Array, dimension_numbers, *, recipe: str | Recipe, backend: Backend = "auto"
) -> PrequantizedWeight:
  """``rhs`` quantized as every ``dot_general(lhs, rhs, dimension_numbers, recipe=recipe)`` would quantize it, once.

  Pass the result as ``dot_general(..., rhs_prequantized=...)`` with the same ``rhs`` (its gradient is still
  ``rhs``'s): the GEMMs read the same bits and skip W's quantizers. Under ``jax.vmap`` over a stack of weights
  (a layer loop's), one batched quantization replaces one per layer. Not differentiated: ``rhs`` is read under
  ``jax.lax.stop_gradient``.

  Args:
    rhs: the weight-like operand, in the dtype the dots receive it (e.g. a Flax ``Dense``'s kernel after its
      promotion to the layer's ``dtype``).
    dimension_numbers: those of the ``dot_general`` calls (only rhs's dims are read).
    recipe: a ``Recipe`` or registered name that ``prequantize_refusal`` accepts.
    backend: the quantizer implementation, as ``dot_general``'s, except that ``"auto"`` gives the kernels W at any
      size (where they take its spec; else XLA's quantizers): it is quantized once per step, and XLA's quantizer
      code would make the program several times larger (BENCHMARKS, ``hlo_census``).

  Returns:
    A ``PrequantizedWeight``.

  Raises:
    ValueError: a recipe ``prequantize_refusal`` refuses (naming why), malformed ``dimension_numbers``, an empty
      ``rhs``.
    TypeError: ``rhs`` not floating point.
  """
  fn = "fp4jax.prequantize_weight"
  r = recipes_lib.get(recipe)
  backend = backends_lib.check(backend, fn)
  why = prequantize_refusal(r)
  if why:
    raise ValueError(f"{fn}(recipe={r.name!r}): W cannot be quantized ahead of the GEMMs: {why}")
  rhs = jax.lax.stop_gradient(jnp.asarray(rhs))
  checks.floating(fn, rhs=rhs)
  if rhs.size == 0:
    raise ValueError(f"{fn}: rhs of shape {rhs.shape} is empty; quantizing needs at least one element")
  rc, rb, rf = _side_dims(rhs.shape, dimension_numbers, "rhs")  # rhs's part of _canonicalize
  bnk = (_size(rhs.shape, rb), _size(rhs.shape, rf), _size(rhs.shape, rc))
  w = jnp.transpose(rhs, rb + rf + rc).reshape(bnk)
  static = _Static(r, None, backend, rhs.dtype, rhs.dtype, rhs.dtype, bnk[2], w_any_size=True)
  fwd, mask = _quantize_operand(static, "fwd_rhs", w, None, r.fwd_lhs.sign_vector(None))  # signs not drawn
  dgrad = None
  if r.dgrad_rhs.source == "input" and r.fwd_rhs.estimator != "dge":  # DGE's dot keeps W and quantizes it there
    dgrad = _quantize_operand(static, "dgrad_rhs", w, None, r.dgrad_lhs.sign_vector(None), transposed=True).operand
  return PrequantizedWeight(fwd, mask, dgrad, r.name, (r.fwd_rhs, r.dgrad_rhs), jnp.dtype(rhs.dtype).name)


def _quantize_gemm(static: _Static, gemm: str, lhs, rhs, keys, signs, transposed=(False, False)) -> list[_Quantized]:
  """Rotate (if the GEMM has a Hadamard) and quantize both operands; an ``Operand`` argument is used as given.

  ``transposed[i]``: the GEMM's operand is ``swapaxes(lhs or rhs, -1, -2)``, which the quantizer reads untransposed
  (the Pallas kernel writes it K-major in the same pass; see ``fp4jax.operand.rotate_and_quantize``).
  """
  return [
    _quantize_operand(static, f"{gemm}_{side}", x, keys, signs, t)
    for side, x, t in (("lhs", lhs, transposed[0]), ("rhs", rhs, transposed[1]))
  ]


def _quantize_operand(static: _Static, name: str, x, keys, signs, transposed: bool = False) -> _Quantized:
  """Operand ``name`` (e.g. ``"fwd_lhs"``) of ``_quantize_gemm``: ``x`` rotated and quantized along its contraction
  axis (the second-to-last when ``transposed``) with the key ``fold_in(key, _KEY_IDS[name])``, taken from ``keys``
  (the call's ``_derive_keys``); an ``Operand`` is used as given. W's operands take ``rotate_and_quantize``'s
  ``any_size`` where ``static.w_any_size``."""
  if isinstance(x, Operand):
    return _Quantized(x, None)
  spec = getattr(static.recipe, name)
  shard = sharding_lib.operand_shard(static.recipe, name)  # None unless the recipe is sharded
  if shard is None:
    x = _pad_chunks(x, spec.hadamard, -2 if transposed else -1)
  k = _fold(keys, _KEY_IDS[name])
  quantized = rotate_and_quantize(
    x, spec, k, signs, backend=static.backend, transposed=transposed, shard=shard, any_size=_w_any_size(static, name)
  )
  return _Quantized(*quantized)


def _w_any_size(static: _Static, name: str) -> bool:
  """Whether operand ``name`` takes the kernels at any size under ``"auto"``: W's (``"fwd_rhs"``, ``"dgrad_rhs"``)
  where W is a layer stack's weight, quantized ahead (``prequantize_weight``, which also quantizes W at any size):
  small, once per layer and step, where XLA's quantizer code would grow every layer's program (quartet2's W,
  re-quantized from its forward tiles by MS-EDEN for the data gradient: BENCHMARKS, ``hlo_census``)."""
  return static.w_any_size and name in ("fwd_rhs", "dgrad_rhs")


def _pad_chunks(x, d: int, axis: int):
  """``x`` zero-padded at the end of ``axis`` (a GEMM's contraction axis) to a multiple of the Hadamard size ``d``
  (unchanged when ``d`` is 0 or divides it). Both operands of the GEMM share ``d`` and so pad alike: the padded
  products are 0·0, the rotation is orthogonal on the padded length, and the contraction sums over it, so the GEMM
  estimates the same product as on whole chunks (unbiased where its quantizers are); the rotated padded positions
  are real values of the rotated vector and are quantized as such."""
  n = x.shape[axis]
  if not d or n % d == 0:
    return x
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, -n % d)
  return jnp.pad(x, pad)


def _quantize_both(static: _Static, x, keys, rows: str, cols: str, signs_rows, signs_cols) -> _Both | None:
  """``x`` quantized as operand ``rows`` (e.g. ``"dgrad_lhs"``) and, transposed, as operand ``cols`` (e.g.
  ``"wgrad_lhs"``) by one kernel for both (``fp4jax.operand.rotate_and_quantize_both``), the bits each GEMM would
  draw. None where that kernel does not run (the XLA backend, a pair the kernels refuse or do not speed up, a ragged
  Hadamard chunk): each GEMM then quantizes its own operand. A sharded recipe's slice is quantized by the pair with
  each direction's shard (the logical tensor's amaxes and random bits)."""
  r = static.recipe
  spec_r, spec_c = getattr(r, rows), getattr(r, cols)
  ragged = (spec_r.hadamard and x.shape[-1] % spec_r.hadamard) or (spec_c.hadamard and x.shape[-2] % spec_c.hadamard)
  if ragged:
    return None
  both = rotate_and_quantize_both(
    x,
    (spec_r, _fold(keys, _KEY_IDS[rows]), signs_rows),
    (spec_c, _fold(keys, _KEY_IDS[cols]), signs_cols),
    backend=static.backend,
    shards=(sharding_lib.operand_shard(r, rows), sharding_lib.operand_shard(r, cols)),
  )
  return None if both is None else _Both(_Quantized(*both[0]), _Quantized(*both[1]))


def _forward_source(spec, raw, forward: Operand):
  """The backward GEMM's W or X according to ``spec.source``: an array to quantize transposed (its GEMM contracts
  the second-to-last axis), or the forward ``Operand`` reused with its last axes swapped."""
  if spec.source == "input":
    return raw
  if spec.is_identity:
    return forward.swap_last()
  return forward.dequantize()


def _to_input(grad, fwd_spec, mask, signs, k: int | None, backend):
  """Gradient of a forward-quantized operand -> gradient of the layer input: estimator, then inverse rotation (both
  in one ``inverse_rotate`` on the ``backend``), then the ``k`` input features (the chain rule through
  ``_pad_chunks``: the zero padding's gradient is dropped)."""
  mask = mask if fwd_spec.estimator == "trust_mask" else None
  if fwd_spec.hadamard:
    grad = inverse_rotate(grad, fwd_spec.hadamard, signs, mask, backend=backend)
  elif mask is not None:
    grad = jnp.where(mask, grad, 0.0)
  return grad[..., :k]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _qdot(static: _Static, x, w, key, pre: PrequantizedWeight | None = None):
  return _qdot_fwd(static, x, w, key, pre, for_backward=False)[0]


def _qdot_fwd(
  static: _Static, x, w, key, pre: PrequantizedWeight | None = None, for_backward: bool = True
) -> tuple[jax.Array, _Residuals]:
  """Y and the backward's residuals. ``for_backward``: where one kernel pass quantizes X for the forward and the
  weight-gradient GEMM (W: the forward and the data-gradient GEMM; ``_quantize_both``), the backward's operand is
  made here and kept instead of X (W). ``pre``: W's operands quantized ahead (``prequantize_weight``), used as
  given."""
  r = static.recipe
  keys = _derive_keys(key)
  signs = r.fwd_lhs.sign_vector(_fold(keys, _SIGNS_IDS["fwd"]))
  bwd_signs = functools.cache(lambda: _bwd_signs(r, keys))  # drawn here only for an operand kept for the backward
  keep_x = r.wgrad_rhs.source == "input"
  keep_w = r.dgrad_rhs.source == "input" or r.fwd_rhs.estimator == "dge"
  x_both = w_both = None
  if for_backward and keep_x:
    x_both = _quantize_both(static, x, keys, "fwd_lhs", "wgrad_rhs", signs, bwd_signs()[1])
  if pre is not None:  # DGE's backward reads W itself (the residual below), not these
    w_both = _Both(_Quantized(pre.fwd, pre.mask), _Quantized(pre.dgrad, None))
  elif for_backward and r.dgrad_rhs.source == "input" and r.fwd_rhs.estimator != "dge":  # DGE's backward reads W
    w_both = _quantize_both(static, w, keys, "fwd_rhs", "dgrad_rhs", signs, bwd_signs()[0])
  fx, fw = _quantize_gemm(
    static,
    "fwd",
    x if x_both is None else x_both.rows.operand,
    w if w_both is None else w_both.rows.operand,
    keys,
    signs,
  )
  mask_x = fx.mask if x_both is None else x_both.rows.mask
  mask_w = fw.mask if w_both is None else w_both.rows.mask
  y = matmul(fx.operand, fw.operand, static.precision).astype(static.out_dtype)
  res = _Residuals(
    x=(x if x_both is None else x_both.cols.operand) if keep_x else None,
    w=(w if w_both is None or r.fwd_rhs.estimator == "dge" else w_both.cols.operand) if keep_w else None,
    xq=None if keep_x else fx.operand,
    wq=fw.operand if r.dgrad_rhs.source == "forward" else None,
    mask_x=mask_x,
    mask_w=mask_w,
    fwd_signs=signs,
    keys=keys,
  )
  return y, res


def _qdot_bwd(static: _Static, res: _Residuals, dy):
  keys = res.keys
  r = static.recipe
  dgrad_signs, wgrad_signs = _bwd_signs(r, keys)
  both = _quantize_both(static, dy, keys, "dgrad_lhs", "wgrad_lhs", dgrad_signs, wgrad_signs)
  dy_dgrad, dy_wgrad = (dy, dy) if both is None else (both.rows.operand, both.cols.operand)
  # dgrad: dX (B, M, K) = dY (B, M, N) . W (B, N, K), contraction over N.
  w_dgrad = _forward_source(r.dgrad_rhs, res.w, res.wq)
  if r.dgrad_rhs.source == "forward" and not r.dgrad_rhs.is_identity:
    # W re-quantized from its forward quantization: when W is a constant of the jitted function (parameters closed
    # over), XLA's constant folder evaluated this chain (dequantize, transpose, FP8 rounding: ms_fp4) off the grid on
    # the CPU (JAX 0.10.2); the barrier keeps it in the compiled program. W-sized, so it costs next to nothing.
    w_dgrad = jax.lax.optimization_barrier(w_dgrad)
  a, b = _quantize_gemm(static, "dgrad", dy_dgrad, w_dgrad, keys, dgrad_signs, (False, True))
  dx = matmul(a.operand, b.operand, static.precision)
  if r.dgrad_rhs.source == "forward":
    dx = _to_input(dx, r.fwd_lhs, res.mask_x, res.fwd_signs, static.k, static.backend)
  # wgrad: dW (B, N, K) = dYᵀ (B, N, M) . X (B, M, K), contraction over M.
  a, b = _quantize_gemm(
    static, "wgrad", dy_wgrad, _forward_source(r.wgrad_rhs, res.x, res.xq), keys, wgrad_signs, (True, True)
  )
  dw = matmul(a.operand, b.operand, static.precision)
  if r.wgrad_rhs.source == "forward":
    dw = _to_input(dw, r.fwd_rhs, res.mask_w, res.fwd_signs, static.k, static.backend)
  if r.fwd_rhs.estimator == "dge":
    spec = r.fwd_rhs
    scaled = widen(res.w) * channel_scale(res.w, spec.scale_pow2, sharding_lib.operand_shard(r, "fwd_rhs"))
    dw = dw * estimators.dge_derivative(scaled, spec.dge_k, spec.dge_cap)
  return dx.astype(static.lhs_dtype), dw.astype(static.rhs_dtype), None, None  # pre: quantized without gradient


_qdot.defvjp(_qdot_fwd, _qdot_bwd)


# ------------------------------------------------------------------------------------------------ public API
def dot_general(
  lhs: jax.Array,
  rhs: jax.Array,
  dimension_numbers,
  *,
  recipe: str | Recipe,
  key: jax.Array | None = None,
  precision=None,
  preferred_element_type=None,
  backend: Backend = "auto",
  rhs_prequantized: PrequantizedWeight | None = None,
) -> jax.Array:
  """``jax.lax.dot_general`` whose forward and backward GEMMs are quantized by ``recipe``.

  Args:
    lhs, rhs: floating-point arrays (the activation-like and the weight-like operand: ``rhs`` plays W in
      ``Y = X·Wᵀ``, so its free dims are the outputs and its gradient is the weight gradient).
    dimension_numbers: ``((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))`` as in ``lax.dot_general``;
      any number of contracting and batch dims.
    recipe: a ``fp4jax.recipes.Recipe`` or a registered name (``fp4jax.recipes.names()``). Inside ``shard_map``
      with the tokens, outputs or inputs split over a mesh axis, ``fp4jax.sharding.sharded(recipe, axis, split)``
      quantizes every operand as one device does on the logical tensors (cross-shard amax, logical random bits).
    key: JAX PRNG key, required when ``recipe.is_random`` (stochastic rounding, MS-EDEN, fresh Hadamard signs).
    precision: passed to the internal GEMMs (default: bf16 GEMMs for exact-in-bf16 quantized values; off the CPU a
      float32 operand against those as three exact bf16 parts; HIGHEST for two float32 ones: ``fp4jax.operand.matmul``).
    preferred_element_type: output dtype (default ``result_type(lhs, rhs)``); gradients keep the input dtypes.
    backend: quantizer implementation of every operand (``fp4jax.backends``): ``"auto"`` (the default; per
      operand: the kernel on a GPU that runs it where it takes the operand, XLA otherwise, and XLA only on a CPU),
      ``"xla"`` (pure JAX) or ``"pallas"`` (the fused quantize kernels of ``fp4jax_kernels``, Hadamard included;
      interpret mode off GPU; ``fp4jax.backends.Unsupported`` for an operand they cannot take); ``"native"`` has no
      quantizer implementation (a ValueError when the first operand is quantized). The same key gives the same
      bits on every backend; see ``fp4jax.operand``. The GEMMs themselves are XLA dots of the exact bf16 values on
      every backend.
    rhs_prequantized: ``prequantize_weight(rhs, dimension_numbers, recipe=...)`` of this ``rhs``: the GEMMs read
      its operands instead of quantizing ``rhs`` (the same bits; ``rhs`` still receives the weight gradient). W's
      other quantizations (a data gradient's W re-quantized from the forward's) then take the kernels at any size
      under ``backend="auto"``, as ``prequantize_weight`` does.

  Returns:
    An array of ``lax.dot_general``'s shape: batch dims, then lhs free dims, then rhs free dims.

  Raises:
    TypeError: ``lhs`` or ``rhs`` not floating point, ``preferred_element_type`` not a floating dtype, ``key`` not a
      PRNG key, ``rhs_prequantized`` not a ``PrequantizedWeight``.
    ValueError: an unknown recipe or backend, malformed ``dimension_numbers`` or mismatched dims, an empty operand,
      a batch of keys, a random recipe without ``key``, a sharded dim that splits a block or Hadamard chunk, a
      ``rhs_prequantized`` of another shape or quantized for other W operands than ``recipe``'s.
  """
  return _dot_general(
    lhs, rhs, dimension_numbers, recipe, key, precision, preferred_element_type, backend, pre=rhs_prequantized
  )


def _dot_general(
  lhs,
  rhs,
  dimension_numbers,
  recipe,
  key,
  precision,
  preferred_element_type,
  backend,
  fn: str = "fp4jax.dot_general",
  labels: tuple[str, str] | None = None,
  pre: PrequantizedWeight | None = None,
) -> jax.Array:
  """``dot_general``; errors name ``fn`` and the user's dims (einsum letters where ``labels`` are given)."""
  recipe = recipes_lib.get(recipe)
  backend = backends_lib.check(backend, fn)
  lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
  checks.floating(fn, **dict(zip(("a", "b") if labels else ("lhs", "rhs"), (lhs, rhs))))
  checks.floating_dtype(fn, "preferred_element_type", preferred_element_type)
  checks.prng_key(fn, key)
  canon = _canonicalize(lhs.shape, rhs.shape, dimension_numbers)
  if recipe.is_identity:
    return jax.lax.dot_general(
      lhs, rhs, canon.dimension_numbers, precision=precision, preferred_element_type=preferred_element_type
    )
  if recipe.is_random and key is None:
    raise ValueError(
      f"recipe {recipe.name!r} is random (stochastic rounding, MS-EDEN or random Hadamard signs): "
      "pass key=jax.random.key(...)"
    )
  _check_shapes(recipe, lhs, rhs, canon, fn, labels)
  out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(lhs, rhs))
  static = _Static(
    recipe, precision, backend, out_dtype, lhs.dtype, rhs.dtype, canon.bmk[2], w_any_size=pre is not None
  )
  if pre is not None:
    _check_prequantized(pre, recipe, canon.bnk, rhs.dtype, fn)
  x = jnp.transpose(lhs, canon.lhs_perm).reshape(canon.bmk)
  w = jnp.transpose(rhs, canon.rhs_perm).reshape(canon.bnk)
  if backend == "pallas":
    _check_backward_runs(static, x, w, key, fn, pre)
  return _qdot(static, x, w, key, pre).reshape(canon.out_shape)


def _check_prequantized(pre, recipe: Recipe, bnk: tuple[int, int, int], dtype, fn: str) -> None:
  """``rhs_prequantized`` is a ``PrequantizedWeight`` of this dot's W: its canonical shape, dtype and W specs."""
  if not isinstance(pre, PrequantizedWeight):
    raise TypeError(f"{fn}: rhs_prequantized must be a PrequantizedWeight (prequantize_weight), got {type(pre)}")
  if pre.specs != (recipe.fwd_rhs, recipe.dgrad_rhs):
    raise ValueError(
      f"{fn}(recipe={recipe.name!r}): rhs_prequantized was quantized for recipe {pre.recipe!r}, whose W operands "
      "differ from this recipe's; prequantize with this dot's recipe"
    )
  if pre.dtype != jnp.dtype(dtype).name:
    raise ValueError(
      f"{fn}: rhs_prequantized was quantized from a {pre.dtype} rhs, this dot's rhs is {jnp.dtype(dtype).name}; "
      "prequantize the rhs in the dtype the dot receives (e.g. a Flax Dense's kernel after its promotion to dtype)"
    )
  d = recipe.fwd_rhs.hadamard
  padded = (*bnk[:2], bnk[2] + (-bnk[2] % d if d else 0))  # _pad_chunks: K to whole Hadamard chunks
  if pre.fwd.values.shape != padded:
    raise ValueError(
      f"{fn}: rhs_prequantized holds W as (batch, out, in) = {pre.fwd.values.shape}, this dot's rhs is {padded}; "
      "prequantize this rhs with these dimension_numbers (a stacked PrequantizedWeight is sliced per call, e.g. by "
      "jax.lax.scan)"
    )


def _check_backward_runs(static: _Static, x, w, key, fn: str, pre: PrequantizedWeight | None = None) -> None:
  """With an explicit ``backend="pallas"``, an operand of the backward's GEMMs that the kernels refuse fails when the
  forward is traced (abstractly: ``jax.eval_shape`` of the layer's VJP), not only once the layer is differentiated.

  Raises:
    Unsupported: a kernel refuses one of the layer's operands, forward or backward.
  """

  def vjp(x, w, key):
    y, pullback = jax.vjp(lambda a, b: _qdot(static, a, b, key, pre), x, w)
    return pullback(jnp.zeros(y.shape, y.dtype))

  try:  # the arguments themselves: their types carry shard_map's varying axes, which a bare ShapeDtypeStruct lacks
    jax.eval_shape(vjp, x, w, key)
  except backends_lib.Unsupported as refusal:
    raise backends_lib.Unsupported(
      f"{fn}: backend='pallas' cannot run this layer's backward (x as (batch, tokens, features) = {x.shape}, "
      f"w as (batch, out, in) = {w.shape}): {refusal}; backend='auto' uses XLA where a kernel refuses"
    ) from None


def einsum(
  spec: str,
  a: jax.Array,
  b: jax.Array,
  *,
  recipe: str | Recipe,
  key: jax.Array | None = None,
  precision=None,
  preferred_element_type=None,
  backend: Backend = "auto",
) -> jax.Array:
  """Two-operand ``jnp.einsum`` lowered to ``fp4jax.dot_general`` (``b`` is the weight-like operand).

  ``spec`` is explicit (``"bsk,nk->bsn"``) or implicit (``"bsk,nk"``: output letters are those appearing once,
  sorted). Letters in both operands and the output are batch dims; in both but not the output, contracted; in one
  operand only and not the output, summed out first. No ellipsis, no repeated letter within an operand.

  Args:
    spec: the einsum string of the two operands.
    a: the activation-like operand (``dot_general``'s ``lhs``).
    b: the weight-like operand (``dot_general``'s ``rhs``: its gradient is the weight gradient).
    recipe: as ``dot_general``'s.
    key: as ``dot_general``'s.
    precision: as ``dot_general``'s.
    preferred_element_type: as ``dot_general``'s.
    backend: as ``dot_general``'s.

  Returns:
    The contraction, with the output letters' dims in ``spec``'s order.

  Raises:
    ValueError: a malformed ``spec`` (ellipsis, repeated letter, letters not matching the operands' ranks), and
      every error of ``dot_general``, naming the einsum letters.
    TypeError: as ``dot_general``.
  """
  a, b = jnp.asarray(a), jnp.asarray(b)
  in_a, in_b, out = _parse_einsum(spec, a.ndim, b.ndim)
  a, in_a = _sum_out(a, in_a, in_b + out)
  b, in_b = _sum_out(b, in_b, in_a + out)
  batch = [c for c in in_a if c in in_b and c in out]
  contract = [c for c in in_a if c in in_b and c not in out]
  dn = (
    (tuple(in_a.index(c) for c in contract), tuple(in_b.index(c) for c in contract)),
    (tuple(in_a.index(c) for c in batch), tuple(in_b.index(c) for c in batch)),
  )
  y = _dot_general(a, b, dn, recipe, key, precision, preferred_element_type, backend, "fp4jax.einsum", (in_a, in_b))
  labels = batch + [c for c in in_a if c not in in_b] + [c for c in in_b if c not in in_a]
  return jnp.transpose(y, tuple(labels.index(c) for c in out))


def _parse_einsum(spec: str, ndim_a: int, ndim_b: int) -> tuple[str, str, str]:
  s = spec.replace(" ", "")
  if "." in s:
    raise ValueError(f"fp4jax.einsum: ellipsis is not supported, got spec {spec!r}")
  ins, arrow, out = s.partition("->")
  operands = ins.split(",")
  if len(operands) != 2:
    raise ValueError(f"fp4jax.einsum takes exactly two operands, got spec {spec!r}")
  in_a, in_b = operands
  if not arrow:
    out = "".join(sorted(c for c in set(in_a + in_b) if (in_a + in_b).count(c) == 1))
  for name, labels, nd in (("a", in_a, ndim_a), ("b", in_b, ndim_b), ("output", out, None)):
    if not labels.isalpha() and labels:
      raise ValueError(f"fp4jax.einsum: spec {spec!r} has a non-letter label in {name}")
    if len(set(labels)) != len(labels):
      raise ValueError(f"fp4jax.einsum: spec {spec!r} repeats a letter in {name} (diagonals are not supported)")
    if nd is not None and len(labels) != nd:
      raise ValueError(f"fp4jax.einsum: spec {spec!r} gives {name} {len(labels)} dims, but it has {nd}")
  missing = set(out) - set(in_a + in_b)
  if missing:
    raise ValueError(f"fp4jax.einsum: output letters {sorted(missing)} appear in no operand of {spec!r}")
  return in_a, in_b, out


def _sum_out(x: jax.Array, labels: str, keep: str) -> tuple[jax.Array, str]:
  drop = tuple(i for i, c in enumerate(labels) if c not in keep)
  if not drop:
    return x, labels
  return jnp.sum(x, axis=drop), "".join(c for c in labels if c in keep)
