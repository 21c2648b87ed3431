"""``ragged_dot``: the grouped (mixture-of-experts) GEMM of ``jax.lax.ragged_dot``, quantized as a ``Recipe`` says.

``lhs`` X [m, k] holds the routed tokens, grouped consecutively: group e owns the next ``group_sizes[e]`` rows;
``rhs`` W [g, k, n] holds one weight per expert. Row r of the output is ``X[r] · W[e(r)]`` (zero for a row in no
group). In ``fp4jax.dot_general``'s terms every expert is a linear layer ``Y_e = X_e · W_eᵀ`` with W_e = ``rhs[e]ᵀ``
(n, k), and a ``jax.custom_vjp`` runs the three GEMMs, each quantizing its operands along its own contraction axis
as the recipe's ``OperandSpec`` says (``fp4jax.dot``'s module docstring: rotations, reuse of forward operands,
estimators):

    fwd    Y_e  = Q(X)_e   · Q(W_e)ᵀ       contraction k (features)
    dgrad  dX_e = Q(dY)_e  · Q(W_eᵀ)ᵀ      contraction n (outputs)
    wgrad  dW_e = Q(dYᵀ)_e · Q(Xᵀ)_eᵀ      contraction over the tokens of group e

Which tensor is one quantized tensor (its amax, its tensor scale, its random bits):

* Each expert's weight is its own tensor: own NVFP4 tensor scale (FP8 current scale), own 16x16 tiles, random bits
  from its own key ``fold_in(fold_in(key, e), operand id)``.
* The routed operands X, dY (fwd, dgrad) and dYᵀ, Xᵀ (wgrad) are each one tensor over all groups: the tensor amax
  is over the whole ragged operand, per-row amaxes (``OperandSpec.amax="row"``, per-channel E2M1) over the whole
  row. Rows in no group are zeroed first (they take no part in any amax and get zero output and gradient).
* Along the tokens (the wgrad GEMM's contraction) no block or Hadamard chunk straddles two groups: inside the op,
  each group's token range is zero-padded at its end to a multiple of ``unit`` (the lcm of the wgrad GEMM's block
  sizes and Hadamard sizes, ``Recipe.shape_rules``; 1 when it has none) and the groups laid end to end, in a static
  buffer of ``unit · ceil((m + g·(unit − 1)) / unit)`` tokens. The zeros contribute nothing to any product and
  are exactly what ``fp4jax.dot_general`` pads one group's tokens with (partial blocks, ``_pad_chunks``), so
  ``dW_e`` is the wgrad GEMM of group e alone on the same quantized operands. Random bits of these operands hash
  their position in the padded buffer.

So every GEMM of every group equals the corresponding ``fp4jax.dot_general`` GEMM on the same quantized operands
(the tests check this against a NumPy oracle). Recipes whose forward or data-gradient GEMM quantizes X or dY in
16x16 tiles (tiles across the tokens) are refused: a tile would straddle two groups.

Group sizes: a static ``group_sizes`` (a concrete array) is checked at trace time (non-negative, summing to at most
m). A traced one follows ``jax.lax.ragged_dot``: groups past the m-th row are cut off at row m (a group's effective
size is ``clip(cumsum, 0, m)`` differences); negative traced sizes are unspecified, as in JAX.

Backends: the quantizers are XLA's (``backend="auto"`` and ``"xla"``); the Pallas kernels do not take ragged
operands yet (``backend="pallas"`` raises ``fp4jax.backends.Unsupported``). The grouped GEMMs are
``jax.lax.ragged_dot_general`` on the exact bf16 values (fp32 accumulation, scales in the epilogue, as
``fp4jax.operand.matmul``). Under ``jax.vmap`` they run as a loop over the batch (``jax.lax.ragged_dot_general``
has no batching rule in JAX 0.10); ``recipe="bf16"`` is ``jax.lax.ragged_dot`` itself and batches as JAX does.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fp4jax._src import backends as backends_lib
from fp4jax._src import checks, estimators
from fp4jax._src import recipes as recipes_lib
from fp4jax._src import sharding as sharding_lib
from fp4jax._src.backends import Backend
from fp4jax._src.dot import (
  _SIGNS_IDS,
  _bwd_signs,
  _derive_keys,
  _fold,
  _forward_source,
  _quantize_operand,
  _Quantized,
  _Static,
  _to_input,
)
from fp4jax._src.ieee import widen
from fp4jax._src.operand import Operand, channel_scale, product
from fp4jax._src.recipes import Recipe

_FN = "fp4jax.ragged_dot"
_ROWS_DN = jax.lax.RaggedDotDimensionNumbers(
  (((1,), (2,)), ((), ())), lhs_ragged_dimensions=(0,), rhs_group_dimensions=(0,)
)
_TOKENS_DN = jax.lax.RaggedDotDimensionNumbers(
  (((1,), (1,)), ((), ())), lhs_ragged_dimensions=(1,), rhs_group_dimensions=()
)


# ------------------------------------------------------------------------------------------------ grouped GEMMs
def _loop_vmap(fn):
  """``fn`` (array arguments) whose ``jax.vmap`` is a ``jax.lax.map`` over the batch (of itself, so nested vmaps
  nest loops): ``jax.lax.ragged_dot_general`` has no batching rule in JAX 0.10."""
  wrapped = jax.custom_batching.custom_vmap(fn)

  @wrapped.def_vmap
  def _rule(axis_size, in_batched, *args):
    del axis_size
    batched = [a for a, b in zip(args, in_batched) if b]

    def one(xs):
      it = iter(xs)
      return wrapped(*(next(it) if b else a for a, b in zip(args, in_batched)))

    return jax.lax.map(one, batched), True

  return wrapped


def _rows_dot(a, b, sizes, precision):
  """(m, c) x (g, s, c) -> (m, s): row r times ``b[e(r)]ᵀ``, groups of ``sizes`` rows; fp32 accumulation."""
  f = lambda a, b, sizes: jax.lax.ragged_dot_general(
    a, b, sizes, _ROWS_DN, precision=precision, preferred_element_type=jnp.float32
  )
  return _loop_vmap(f)(a, b, sizes)


def _tokens_dot(a, b, sizes, precision):
  """(r, p) x (s, p) -> (g, r, s): per group, the contraction over its ``sizes[e]`` consecutive columns."""
  f = lambda a, b, sizes: jax.lax.ragged_dot_general(
    a, b, sizes, _TOKENS_DN, precision=precision, preferred_element_type=jnp.float32
  )
  return _loop_vmap(f)(a, b, sizes)


# ------------------------------------------------------------------------------------------------ groups
class _Groups(NamedTuple):
  """The rows of each group (effective sizes, ``jax.lax.ragged_dot``'s cut at row m) and the padded token layout."""

  sizes: jax.Array  # (g,) int32: rows of each group that exist
  gid: jax.Array  # (m,) int32: the group of each row; g for a row in no group
  src: jax.Array  # (P,) int32: the row at each position of the padded token buffer (0 where ``valid`` is False)
  valid: jax.Array  # (P,) bool: the position holds a row (else it is padding: zeros)
  padded: jax.Array  # (g,) int32: each group's padded length (a multiple of the unit)


def _groups(group_sizes, m: int, unit: int) -> _Groups:
  g = group_sizes.shape[0]
  ends = jnp.clip(jax.lax.cummax(jnp.cumsum(group_sizes.astype(jnp.int32))), 0, m)
  starts = ends - jnp.diff(ends, prepend=0)
  sizes = ends - starts
  gid = jnp.searchsorted(ends, jnp.arange(m, dtype=jnp.int32), side="right").astype(jnp.int32)
  padded = (sizes + unit - 1) // unit * unit
  pends = jnp.cumsum(padded)
  p = jnp.arange(unit * math.ceil((m + g * (unit - 1)) / unit), dtype=jnp.int32)
  h = jnp.minimum(jnp.searchsorted(pends, p, side="right"), g - 1)
  offset = p - (pends[h] - padded[h])
  valid = (p < pends[-1]) & (offset < sizes[h])
  return _Groups(sizes, gid, jnp.where(valid, starts[h] + offset, 0), valid, padded)


def _to_tokens(x, groups: _Groups):
  """Rows of ``x`` (an array or an ``Operand`` with scalar or per-row scales) in the padded token layout."""
  if isinstance(x, Operand):
    scale = _to_tokens(x.scale, groups) if jnp.ndim(x.scale) else x.scale
    return Operand(_to_tokens(x.values, groups), scale)
  return jnp.where(groups.valid[:, None], x[groups.src], jnp.zeros((), x.dtype))


def _tokens_unit(recipe: Recipe) -> int:
  rules = [r.multiple for r in recipe.shape_rules if r.gemm == "wgrad" and r.dim == "tokens"]
  return math.lcm(1, *rules)


# ------------------------------------------------------------------------------------------------ operands
def _experts(static: _Static, name: str, w, key, signs, transposed: bool = False) -> _Quantized:
  """Operand ``name`` of every expert, each its own tensor with key ``fold_in(key, e)``: a batch (g, ...) of
  ``_quantize_operand`` results (scalar scales become (g,), per-row ones (g, rows, 1))."""
  one = lambda w, k: _quantize_operand(static, name, w, _derive_keys(k), signs, transposed)
  if key is None:
    return jax.vmap(lambda w: one(w, None))(w)
  keys = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(_num_experts(w), dtype=jnp.uint32))
  return jax.vmap(one)(w, keys)


def _num_experts(w) -> int:
  return (w.values if isinstance(w, Operand) else w).shape[0]


def _rows_matmul(a: Operand, b: Operand, groups: _Groups, precision) -> jax.Array:
  """Row r: ``(a.values[r] · b.values[e(r)]ᵀ) ⊙ (a.scale · b.scale[e(r)]ᵀ)`` (``fp4jax.operand.matmul`` per group);
  zero for a row in no group."""
  y = product(a.values, b.values, precision, lambda u, v, p: _rows_dot(u, v, groups.sizes, p))
  g = b.values.shape[0]
  sb = b.scale[jnp.minimum(groups.gid, g - 1)]
  sb = sb[:, None] if sb.ndim == 1 else sb[..., 0]  # (m, 1) or per row of b: (m, s)
  return jnp.where((groups.gid < g)[:, None], y * (a.scale * sb), 0.0)


def _tokens_matmul(a: Operand, b: Operand, groups: _Groups, precision) -> jax.Array:
  """Per group e: ``fp4jax.operand.matmul`` of its padded token columns of ``a`` (r, P) and ``b`` (s, P)."""
  y = product(a.values, b.values, precision, lambda u, v, p: _tokens_dot(u, v, groups.padded, p))
  sb = jnp.swapaxes(b.scale, -1, -2) if jnp.ndim(b.scale) else b.scale
  return y * (a.scale * sb)


# ------------------------------------------------------------------------------------------------ the custom VJP
@dataclasses.dataclass(frozen=True)
class _RStatic:
  base: _Static
  unit: int  # the token unit of the wgrad GEMM (``_tokens_unit``)


class _Residuals(NamedTuple):
  x: jax.Array | None  # X (m, k), rows in no group zeroed, when the wgrad GEMM quantizes X itself
  w: jax.Array | None  # W (g, n, k) when the dgrad GEMM quantizes W itself or the forward estimator is DGE
  xq: Operand | None  # the forward-quantized X, for a wgrad GEMM with ``source="forward"``
  wq: Operand | None  # the forward-quantized W of every expert, for a dgrad GEMM with ``source="forward"``
  mask_x: jax.Array | None
  mask_w: jax.Array | None
  fwd_signs: jax.Array | None
  group_sizes: jax.Array
  key: jax.Array | None


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _rdot(static: _RStatic, x, w, group_sizes, key):
  return _rdot_fwd(static, x, w, group_sizes, key)[0]


def _rdot_fwd(static: _RStatic, x, w, group_sizes, key):
  s, r = static.base, static.base.recipe
  groups = _groups(group_sizes, x.shape[0], static.unit)
  x = jnp.where((groups.gid < w.shape[0])[:, None], x, jnp.zeros((), x.dtype))
  keys = _derive_keys(key)
  signs = r.fwd_lhs.sign_vector(_fold(keys, _SIGNS_IDS["fwd"]))
  fx = _quantize_operand(s, "fwd_lhs", x, keys, signs)
  fw = _experts(s, "fwd_rhs", w, key, signs)
  y = _rows_matmul(fx.operand, fw.operand, groups, s.precision).astype(s.out_dtype)
  keep_x = r.wgrad_rhs.source == "input"
  res = _Residuals(
    x=x if keep_x else None,
    w=w if r.dgrad_rhs.source == "input" or r.fwd_rhs.estimator == "dge" else None,
    xq=None if keep_x else fx.operand,
    wq=fw.operand if r.dgrad_rhs.source == "forward" else None,
    mask_x=fx.mask,
    mask_w=fw.mask,
    fwd_signs=signs,
    group_sizes=group_sizes,
    key=key,
  )
  return y, res


def _rdot_bwd(static: _RStatic, res: _Residuals, dy):
  s, r, key = static.base, static.base.recipe, res.key
  g = _num_experts(res.w if res.wq is None else res.wq)
  groups = _groups(res.group_sizes, dy.shape[0], static.unit)
  dy = jnp.where((groups.gid < g)[:, None], dy, jnp.zeros((), dy.dtype))
  keys = _derive_keys(key)
  dgrad_signs, wgrad_signs = _bwd_signs(r, keys)
  # dgrad: dX (m, k), row r = dY[r] (n) . W_e (n, k), contraction over n.
  a = _quantize_operand(s, "dgrad_lhs", dy, keys, dgrad_signs)
  w_src = jax.vmap(functools.partial(_forward_source, r.dgrad_rhs))(res.w, res.wq)
  b = _experts(s, "dgrad_rhs", w_src, key, dgrad_signs, transposed=True)
  dx = _rows_matmul(a.operand, b.operand, groups, s.precision)
  if r.dgrad_rhs.source == "forward":
    dx = _to_input(dx, r.fwd_lhs, res.mask_x, res.fwd_signs, s.k, s.backend)
  # wgrad: dW_e (n, k) = dY_eᵀ (n, tokens of e) . X_e (tokens of e, k), on the padded token layout.
  a = _quantize_operand(s, "wgrad_lhs", _to_tokens(dy, groups), keys, wgrad_signs, transposed=True)
  x_src = _forward_source(r.wgrad_rhs, _to_tokens(res.x, groups) if res.xq is None else None, _xq_tokens(res, groups))
  b = _quantize_operand(s, "wgrad_rhs", x_src, keys, wgrad_signs, transposed=True)
  dw = _tokens_matmul(a.operand, b.operand, groups, s.precision)
  if r.wgrad_rhs.source == "forward":
    dw = _to_input(dw, r.fwd_rhs, res.mask_w, res.fwd_signs, s.k, s.backend)
  if r.fwd_rhs.estimator == "dge":
    spec = r.fwd_rhs
    dw = dw * estimators.dge_derivative(widen(res.w) * channel_scale(res.w, spec.scale_pow2), spec.dge_k, spec.dge_cap)
  return dx.astype(s.lhs_dtype), dw.astype(s.rhs_dtype), None, None


def _xq_tokens(res: _Residuals, groups: _Groups) -> Operand | None:
  return None if res.xq is None else _to_tokens(res.xq, groups)


_rdot.defvjp(_rdot_fwd, _rdot_bwd)


# ------------------------------------------------------------------------------------------------ public API
def ragged_dot(
  lhs: jax.Array,
  rhs: jax.Array,
  group_sizes: jax.Array,
  *,
  recipe: str | Recipe,
  key: jax.Array | None = None,
  precision=None,
  preferred_element_type=None,
  backend: Backend = "auto",
) -> jax.Array:
  """``jax.lax.ragged_dot`` (mixture-of-experts GEMM) whose forward and backward GEMMs are quantized by ``recipe``.

  Output row r is ``lhs[r] · rhs[e]`` for the group e holding row r (groups of ``group_sizes[e]`` consecutive rows
  from row 0), zero for rows past the last group. Each expert's weight is its own quantized tensor; the routed
  activations and gradients are one tensor over all groups (tensor amax over the whole ragged operand); along the
  tokens each group is zero-padded to whole blocks and Hadamard chunks, so no unit straddles two groups and every
  group's GEMMs equal ``fp4jax.dot_general``'s on the same quantized operands (``fp4jax._src.ragged``'s module
  docstring has the details). ``recipe="bf16"`` is ``jax.lax.ragged_dot``.

  Args:
    lhs: [m, k] floating-point tokens, grouped consecutively by expert.
    rhs: [g, k, n] floating-point expert weights (the weight-like operand: its gradient is the weight gradient).
    group_sizes: [g] integers, the rows of each group; a concrete array is checked at trace time (non-negative,
      summing to at most m); a traced one past row m is cut off at row m, as ``jax.lax.ragged_dot`` does.
    recipe: a ``fp4jax.recipes.Recipe`` or a registered name (``fp4jax.recipes.names()``); not a sharded recipe.
    key: JAX PRNG key, required when ``recipe.is_random``.
    precision: passed to the internal GEMMs (as ``fp4jax.dot_general``'s).
    preferred_element_type: output dtype (default ``result_type(lhs, rhs)``); gradients keep the input dtypes.
    backend: ``"auto"`` or ``"xla"``: the XLA quantizers (the Pallas kernels do not take ragged operands yet).

  Returns:
    [m, n] array.

  Raises:
    TypeError: ``lhs`` or ``rhs`` not floating point, ``group_sizes`` not integer, ``preferred_element_type`` not a
      floating dtype, ``key`` not a PRNG key.
    ValueError: wrong ranks, mismatched k or g, static ``group_sizes`` negative or summing to more than m, an empty
      operand, an unknown recipe or backend, a sharded recipe, a recipe quantizing X or dY in 16x16 tiles, a random
      recipe without ``key``.
    fp4jax.backends.Unsupported: ``backend="pallas"`` or ``"native"``.
  """
  recipe = recipes_lib.get(recipe)
  backend = backends_lib.check(backend, _FN)
  lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
  checks.floating(_FN, lhs=lhs, rhs=rhs)
  checks.floating_dtype(_FN, "preferred_element_type", preferred_element_type)
  checks.prng_key(_FN, key)
  _check_shapes(lhs, rhs, group_sizes)
  if recipe.is_identity:
    return jax.lax.ragged_dot(lhs, rhs, group_sizes, precision=precision, preferred_element_type=preferred_element_type)
  _check_recipe(recipe, backend, key, lhs, rhs)
  out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(lhs, rhs))
  base = _Static(recipe, precision, "xla", out_dtype, lhs.dtype, rhs.dtype, lhs.shape[1])
  w = jnp.swapaxes(rhs, 1, 2)  # (g, n, k): each expert's W as fp4jax.dot_general's rhs
  return _rdot(_RStatic(base, _tokens_unit(recipe)), lhs, w, group_sizes, key)


def _check_shapes(lhs, rhs, group_sizes) -> None:
  shapes = f"lhs {lhs.shape}, rhs {rhs.shape}, group_sizes {group_sizes.shape}"
  if lhs.ndim != 2 or rhs.ndim != 3 or group_sizes.ndim != 1:
    raise ValueError(f"{_FN}: expected lhs [m, k], rhs [g, k, n] and group_sizes [g]; got {shapes}")
  if lhs.shape[1] != rhs.shape[1]:
    raise ValueError(
      f"{_FN}: lhs's k = {lhs.shape[1]} must equal rhs's k = {rhs.shape[1]} (rhs is [g, k, n]); {shapes}"
    )
  if group_sizes.shape[0] != rhs.shape[0]:
    raise ValueError(f"{_FN}: group_sizes has {group_sizes.shape[0]} groups, rhs has g = {rhs.shape[0]}; {shapes}")
  if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise TypeError(f"{_FN}: group_sizes must be an integer array, got {group_sizes.dtype}")
  try:
    sizes = np.asarray(group_sizes)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return  # traced: jax.lax.ragged_dot's semantics (module docstring)
  if (sizes < 0).any() or sizes.sum() > lhs.shape[0]:
    raise ValueError(
      f"{_FN}: group_sizes {sizes.tolist()} must be non-negative and sum to at most lhs's m = {lhs.shape[0]} "
      f"(sum {sizes.sum()})"
    )


def _check_recipe(recipe: Recipe, backend: str, key, lhs, rhs) -> None:
  if backend not in ("auto", "xla"):
    raise backends_lib.Unsupported(
      f"{_FN}: backend={backend!r} does not take ragged operands yet; use 'auto' or 'xla' (the XLA quantizers)"
    )
  if isinstance(recipe, sharding_lib.ShardedRecipe):
    raise ValueError(f"{_FN}: sharded recipes (fp4jax.sharding) are not supported; shard the experts under jit")
  tiled = [name for name in ("fwd_lhs", "dgrad_lhs") if getattr(recipe, name).block_shape is not None]
  if tiled:
    raise ValueError(
      f"{_FN}: recipe {recipe.name!r} quantizes {tiled} in 16x16 tiles across the tokens, "
      "which would straddle two groups"
    )
  if recipe.is_random and key is None:
    raise ValueError(f"{_FN}: recipe {recipe.name!r} is random: pass key=jax.random.key(...)")
  for name, a in (("lhs", lhs), ("rhs", rhs)):
    if a.size == 0:
      raise ValueError(f"{_FN}(recipe={recipe.name!r}): {name} of shape {a.shape} is empty")
