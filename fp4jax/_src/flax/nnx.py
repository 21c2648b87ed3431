"""FP4 layers for Flax NNX, and rule-based quantization of existing NNX models.

Explicit use::

    layer = Linear(256, 512, recipe="nvidia_nvfp4", rngs=nnx.Rngs(params=0, quant=1))
    nnx.Linear(256, 512, dot_general=DotGeneral("quartet", rngs=rngs), rngs=rngs)     # the same

Existing models, changed in place (see ``fp4jax.flax.rules``)::

    quantize(model, [keep_high_precision(last=1), Rule(r".*", "quartet")], rngs=nnx.Rngs(quant=0))

``DotGeneral`` / ``EinsumOp`` are small modules that stand in for ``lax.dot_general`` / ``jnp.einsum`` inside the
layers (``nnx.Linear.dot_general``, ``nnx.LinearGeneral.dot_general``, ``nnx.Einsum.einsum_op``). Each holds its
recipe, a ``deterministic`` flag (set by ``model.eval()`` / ``model.train()``) and a fork of the "quant" RNG stream;
a random recipe draws a fresh key from it on every call, so every layer and step gets distinct bits and the stream
state advances through ``nnx.jit`` / ``nnx.value_and_grad``. Without a "quant" stream a random recipe raises at
call time unless ``deterministic=True`` (which runs ``fp4jax.recipes.deterministic(recipe)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from fp4jax._src import dot, ragged
from fp4jax._src.backends import Backend
from fp4jax._src.flax import moe, ops
from fp4jax._src.flax import rules as rules_lib

LAYERS = (nnx.Linear, nnx.LinearGeneral, nnx.Einsum)
_OP_ATTR = {nnx.Linear: "dot_general", nnx.LinearGeneral: "dot_general", nnx.Einsum: "einsum_op"}


def _stream(rngs):
  if rngs is None:
    return nnx.data(None)
  if isinstance(rngs, nnx.Rngs):
    return rngs[ops.QUANT_STREAM].fork() if ops.QUANT_STREAM in rngs else nnx.data(None)
  if isinstance(rngs, nnx.RngStream):
    return rngs.fork()
  raise TypeError(
    f"rngs must be an nnx.Rngs (with a {ops.QUANT_STREAM!r} stream), an nnx.RngStream or None, got {rngs!r}"
  )


class _QuantOp(nnx.Module):
  """Recipe, ``deterministic`` flag, quantizer ``backend`` (``fp4jax.dot_general``'s) and "quant" stream of an FP4
  op; ``path`` names its layer in errors and summaries."""

  def __init__(self, recipe: Any, *, rngs=None, deterministic: bool = False, path: str = "", backend: Backend = "auto"):
    ops.resolve(recipe, f"fp4jax {type(self).__name__}")
    ops.check_backend(backend, f"fp4jax.flax.nnx.{type(self).__name__}")
    self.recipe = recipe
    self.backend = backend
    self.deterministic = deterministic
    self.rngs = _stream(rngs)
    self.path = path or type(self).__name__

  def _recipe_and_key(self):
    where = f"fp4jax {type(self).__name__} at {self.path!r}"
    run = ops.effective(self.recipe, self.deterministic, where)
    if not run.is_random:
      return run, None
    if self.rngs is None:
      raise ops.missing_stream_error(where, self.recipe, "pass rngs=nnx.Rngs(quant=...) when building the layer")
    return run, self.rngs()

  @staticmethod
  def _check_sharding(out_sharding):
    if out_sharding is not None:
      raise NotImplementedError(f"fp4jax ops do not take out_sharding; got {out_sharding!r} (shard the inputs instead)")


class DotGeneral(_QuantOp):
  """``lax.dot_general`` replaced by ``fp4jax.dot_general`` under ``recipe``: an NNX ``dot_general``."""

  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, out_sharding=None):
    self._check_sharding(out_sharding)
    run, key = self._recipe_and_key()
    ops.record(self.path, "dot_general", self.recipe, ops.dot_general_flops(lhs.shape, rhs.shape, dimension_numbers))
    return dot.dot_general(
      lhs,
      rhs,
      dimension_numbers,
      recipe=run,
      key=key,
      precision=precision,
      preferred_element_type=preferred_element_type,
      backend=self.backend,
    )


class EinsumOp(_QuantOp):
  """``jnp.einsum`` (two operands) replaced by ``fp4jax.einsum`` under ``recipe``: an NNX ``einsum_op``."""

  def __call__(self, spec, lhs, rhs, precision=None, preferred_element_type=None, out_sharding=None):
    self._check_sharding(out_sharding)
    run, key = self._recipe_and_key()
    ops.record(self.path, "einsum", self.recipe, ops.einsum_flops(spec, lhs.shape, rhs.shape))
    return dot.einsum(
      spec,
      lhs,
      rhs,
      recipe=run,
      key=key,
      precision=precision,
      preferred_element_type=preferred_element_type,
      backend=self.backend,
    )


class Linear(nnx.Linear):
  """``nnx.Linear`` whose matmul runs ``fp4jax.dot_general`` under ``recipe`` (see ``DotGeneral``)."""

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    recipe: Any,
    rngs: nnx.Rngs,
    deterministic: bool = False,
    backend: Backend = "auto",
    **kwargs,
  ):
    op = DotGeneral(recipe, rngs=rngs, deterministic=deterministic, backend=backend)
    super().__init__(in_features, out_features, dot_general=op, rngs=rngs, **kwargs)


class Einsum(nnx.Einsum):
  """``nnx.Einsum`` whose contraction runs ``fp4jax.einsum`` under ``recipe`` (see ``EinsumOp``)."""

  def __init__(
    self,
    einsum_str: str,
    kernel_shape,
    bias_shape=None,
    *,
    recipe: Any,
    rngs: nnx.Rngs,
    deterministic: bool = False,
    backend: Backend = "auto",
    **kwargs,
  ):
    op = EinsumOp(recipe, rngs=rngs, deterministic=deterministic, backend=backend)
    super().__init__(einsum_str, kernel_shape, bias_shape, einsum_op=op, rngs=rngs, **kwargs)


class RaggedDot(_QuantOp):
  """``jax.lax.ragged_dot`` replaced by ``fp4jax.ragged_dot`` under ``recipe`` (a fresh "quant" key per call)."""

  def __call__(self, lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    run, key = self._recipe_and_key()
    return ragged.ragged_dot(
      lhs,
      rhs,
      group_sizes,
      recipe=run,
      key=key,
      precision=precision,
      preferred_element_type=preferred_element_type,
      backend=self.backend,
    )


class _Router(nnx.Module):
  """``moe.router_logits`` with its own ``kernel`` [d, E], drawn as ``nnx.Linear`` draws its kernel."""

  def __init__(self, in_features: int, num_experts: int, param_dtype, rngs: nnx.Rngs):
    self.kernel = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (in_features, num_experts), param_dtype))

  def __call__(self, x: jax.Array) -> jax.Array:
    return moe.router_logits(x, self.kernel[...])


class MoE(nnx.Module):
  """Mixture-of-experts MLP, the NNX twin of ``fp4jax.flax.linen.MoE`` (same parameters and computation): a float32
  top-k router (``router``: ``kernel`` [d, E] as ``nnx.Linear`` initializes it, float32 logits, not a Linear, so
  rules never quantize it), experts ``w_in`` [E, d, 2·hidden or hidden] and
  ``w_out`` [E, hidden, d] through ``RaggedDot`` (``ragged``) under ``recipe``.

  Args:
    in_features: d.
    hidden: each expert's hidden width.
    num_experts: E.
    top_k: experts per token.
    recipe: a recipe name or ``fp4jax.recipes.Recipe``.
    rngs: ``nnx.Rngs`` with "params" (and "quant" for a random recipe).
    deterministic: evaluation mode (set by ``model.eval()``).
    backend: ``fp4jax.ragged_dot``'s ``backend``.
    gated: SwiGLU-style experts, activation(gate) ⊙ up; else activation(W_in x).
    activation: the experts' nonlinearity.
    param_dtype: dtype of the parameters.
  """

  def __init__(
    self,
    in_features: int,
    hidden: int,
    num_experts: int,
    top_k: int,
    *,
    recipe: Any,
    rngs: nnx.Rngs,
    deterministic: bool = False,
    backend: Backend = "auto",
    gated: bool = True,
    activation=nnx.silu,
    param_dtype=jnp.float32,
  ):
    init = nnx.initializers.lecun_normal(in_axis=1, out_axis=2, batch_axis=(0,))
    width = hidden * (2 if gated else 1)
    self.router = _Router(in_features, num_experts, param_dtype, rngs)
    self.w_in = nnx.Param(init(rngs.params(), (num_experts, in_features, width), param_dtype))
    self.w_out = nnx.Param(init(rngs.params(), (num_experts, hidden, in_features), param_dtype))
    self.ragged = RaggedDot(recipe, rngs=rngs, deterministic=deterministic, path="MoE", backend=backend)
    self.top_k, self.gated, self.activation = top_k, gated, activation

  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., d] -> [..., d]."""
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    y = moe.experts_forward(
      tokens,
      logits,
      self.w_in[...],
      self.w_out[...],
      top_k=self.top_k,
      activation=self.activation,
      gated=self.gated,
      ragged=lambda lhs, rhs, sizes: self.ragged(lhs, rhs.astype(lhs.dtype), sizes),
    )
    return y.reshape(x.shape).astype(x.dtype)


# ------------------------------------------------------------------------------------------------ rules
def layers(model: nnx.Module) -> dict[str, nnx.Module]:
  """The quantizable layers (Linear, LinearGeneral, Einsum) of ``model``, in graph order.

  Args:
    model: an NNX Module.

  Returns:
    ``{path: layer}``, the path being the graph path's parts joined by ``/``.
  """
  return {"/".join(str(p) for p in path): m for path, m in nnx.iter_graph(model) if isinstance(m, LAYERS)}


def _op_attr(layer) -> str:
  return next(attr for cls, attr in _OP_ATTR.items() if isinstance(layer, cls))


def layer_recipe(layer) -> Any:
  """The recipe a layer runs (its fp4jax op's), or None for a plain dot.

  Args:
    layer: a quantizable NNX layer (``nnx.Linear``, ``nnx.LinearGeneral`` or ``nnx.Einsum``, as ``layers`` finds).

  Returns:
    The recipe (name or ``Recipe``, as it was given) of the layer's fp4jax op, or None.
  """
  op = getattr(layer, _op_attr(layer))
  return op.recipe if isinstance(op, _QuantOp) else None


def set_recipe(
  layer, path: str, recipe: Any, *, rngs=None, deterministic: bool = False, backend: Backend = "auto"
) -> None:
  """Make ``layer`` run ``recipe`` (None: ``lax.dot_general`` / ``jnp.einsum``) with quantizer ``backend``, in place.

  Args:
    layer: a quantizable NNX layer (``nnx.Linear``, ``nnx.LinearGeneral`` or ``nnx.Einsum``).
    path: the layer's path, used in error messages and summaries.
    recipe: a recipe name, a ``Recipe``, or None for the plain high-precision op.
    rngs: ``nnx.Rngs`` (or an ``nnx.RngStream``) holding the "quant" stream a random recipe draws from.
    deterministic: run the recipe's deterministic variant (RTN, fixed Hadamard signs).
    backend: the quantizer backend (``fp4jax.dot_general``'s), one of ``fp4jax.Backend``.

  Returns:
    None.

  Raises:
    TypeError: ``recipe`` is neither a name, a ``Recipe`` nor None.
    ValueError: an unknown recipe name, or (with a recipe) a ``backend`` not among ``fp4jax.Backend``'s names.
  """
  attr = _op_attr(layer)
  if recipe is None:
    op = nnx.static(jnp.einsum if attr == "einsum_op" else jax.lax.dot_general)
  else:
    op_cls = EinsumOp if attr == "einsum_op" else DotGeneral
    op = nnx.data(op_cls(recipe, rngs=rngs, deterministic=deterministic, path=path, backend=backend))
  setattr(layer, attr, op)
  if isinstance(layer, nnx.LinearGeneral):
    layer.dot_general_cls = None  # it would take precedence over dot_general


def quantize(
  model: nnx.Module,
  rules: Sequence[Any],
  *,
  rngs: nnx.Rngs | None = None,
  defaults: Sequence[Any] = rules_lib.DEFAULT_HIGH_PRECISION,
  deterministic: bool = False,
  backend: Backend = "auto",
) -> nnx.Module:
  """Quantize the linear layers of ``model`` in place by ``rules`` (``fp4jax.flax.rules.plan``); returns ``model``.

  ``rngs`` supplies the "quant" stream random recipes draw from (each layer gets a fork); it may be omitted when
  every planned recipe is deterministic or ``deterministic=True``. Layers no rule matches are left as they are.

  Args:
    model: an NNX Module; changed in place.
    rules: a sequence of ``Rule`` s and policies (``keep_high_precision``), matched against the paths of
      ``layers(model)``.
    rngs: ``nnx.Rngs`` with a "quant" stream (or an ``nnx.RngStream``); needed by random recipes.
    defaults: rules applied after ``rules`` (default: keep the output head in high precision).
    deterministic: run every recipe's deterministic variant (RTN, fixed Hadamard signs; for evaluation).
    backend: the quantizer backend of the planned layers (``fp4jax.dot_general``'s), one of ``fp4jax.Backend``.

  Returns:
    ``model`` itself.

  Raises:
    TypeError: ``model`` is not an NNX Module; ``rules`` is not a sequence of rules / policies; a recipe that is
      neither a name nor a ``Recipe``.
    ValueError: ``backend`` is not one of ``fp4jax.Backend``'s names; a rule or policy that matches or decides no
      layer (``fp4jax.flax.rules.plan``); an unknown recipe name; a random recipe planned with no "quant" stream in
      ``rngs`` and ``deterministic=False``.
  """
  if not isinstance(model, nnx.Module):
    raise TypeError(f"model must be a flax.nnx Module, got {type(model).__name__}")
  ops.check_backend(backend, "fp4jax.flax.nnx.quantize")
  found = layers(model)
  plan = rules_lib.plan(list(found), rules, defaults=defaults)
  has_stream = isinstance(rngs, nnx.Rngs) and ops.QUANT_STREAM in rngs or isinstance(rngs, nnx.RngStream)
  for path, recipe in plan.items():
    if recipe is not None and not deterministic and not has_stream and ops.resolve(recipe, path).is_random:
      raise ops.missing_stream_error(f"quantize: layer {path!r}", recipe, "pass rngs=nnx.Rngs(quant=...) to quantize")
    set_recipe(found[path], path, recipe, rngs=rngs, deterministic=deterministic, backend=backend)
  return model
