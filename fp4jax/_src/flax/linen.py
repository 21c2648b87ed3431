"""FP4 layers for Flax linen, and rule-based quantization of existing linen models.

Explicit use, in a model you write::

    nn.Dense(512, dot_general_cls=functools.partial(DotGeneral, recipe="nvidia_nvfp4"))
    Dense(512, recipe="quartet")              # the same, as a layer
    model.apply(variables, x, rngs={"quant": key})

Existing models, unchanged (rules on module paths, see ``fp4jax.flax.rules``)::

    qmodel = quantize(model, [keep_high_precision(last=1), Rule(r".*", "nvidia_nvfp4")])
    variables = qmodel.init(key, x); y = qmodel.apply(variables, x, rngs={"quant": key})

Randomness: a random recipe draws one key per call with ``make_rng("quant")``; linen folds the module path and a
per-call counter into it, so every layer and call gets distinct bits, and a new "quant" key per step gives new
bits per step (under ``nn.scan`` over layers, pass ``split_rngs={"quant": True}``). Without a "quant" stream a
random recipe raises, except with ``deterministic=True`` (evaluation: ``fp4jax.recipes.deterministic(recipe)``)
and during ``init``, where keys come from the "params" stream (parameters do not depend on those bits).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fp4jax._src import dot, ragged
from fp4jax._src.backends import Backend
from fp4jax._src.flax import moe, ops
from fp4jax._src.flax import rules as rules_lib

LAYERS = (nn.Dense, nn.DenseGeneral, nn.Einsum)


def _key(module: nn.Module, recipe: Any, deterministic: bool, where: str):
  """(Recipe to run, key or None). Keys come from "quant"; while initializing without it, from "params"."""
  run = ops.effective(recipe, deterministic, where)
  if not run.is_random:
    return run, None
  if module.has_rng(ops.QUANT_STREAM):
    return run, module.make_rng(ops.QUANT_STREAM)
  if module.is_initializing() and module.has_rng("params"):
    return run, module.make_rng("params")
  raise ops.missing_stream_error(where, recipe, 'pass rngs={"quant": key} to apply')


class DotGeneral(nn.Module):
  """``lax.dot_general`` replaced by ``fp4jax.dot_general`` under ``recipe``: a linen ``dot_general_cls``.

  Attributes:
    recipe: a name from ``fp4jax.recipes.names()`` or a ``fp4jax.recipes.Recipe``.
    deterministic: evaluation mode; runs ``fp4jax.recipes.deterministic(recipe)`` and needs no "quant" stream.
    backend: quantizer implementation, ``fp4jax.dot_general``'s ``backend`` (default ``"auto"``; ``fp4jax.backends``).
    rhs_prequantized: ``fp4jax.prequantize_weight`` of the kernel this dot receives (e.g. a layer loop's slice of
      weights quantized for all layers before the loop), passed to ``fp4jax.dot_general``; None quantizes it here.
  """

  recipe: Any
  deterministic: bool = False
  backend: Backend = "auto"
  rhs_prequantized: Any = None

  def __post_init__(self):
    ops.check_backend(self.backend, f"fp4jax.flax.linen.{type(self).__name__}")
    super().__post_init__()

  @nn.compact
  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    run, key = _key(self, self.recipe, self.deterministic, f"fp4jax DotGeneral at {_path(self)!r}")
    return dot.dot_general(
      lhs,
      rhs,
      dimension_numbers,
      recipe=run,
      key=key,
      precision=precision,
      preferred_element_type=preferred_element_type,
      backend=self.backend,
      rhs_prequantized=self.rhs_prequantized,
    )


def _dot_general_cls(recipe: Any, deterministic: bool, backend: Backend = "auto"):
  return functools.partial(DotGeneral, recipe=recipe, deterministic=deterministic, backend=backend)


def _is_fp4jax_cls(cls) -> bool:
  return isinstance(cls, functools.partial) and cls.func is DotGeneral


class _RecipeDot:
  """Mixin for ``nn.Dense`` / ``nn.DenseGeneral``: ``dot_general_cls`` is derived from ``recipe``."""

  def __post_init__(self):
    if self.dot_general is not None or (self.dot_general_cls is not None and not _is_fp4jax_cls(self.dot_general_cls)):
      raise ValueError(f"fp4jax.flax.linen.{type(self).__name__} takes `recipe`, not dot_general / dot_general_cls")
    ops.check_backend(self.backend, f"fp4jax.flax.linen.{type(self).__name__}")
    object.__setattr__(self, "dot_general_cls", _dot_general_cls(self.recipe, self.deterministic, self.backend))
    super().__post_init__()


class Dense(_RecipeDot, nn.Dense):
  """``nn.Dense`` whose matmul runs ``fp4jax.dot_general`` under ``recipe`` (see ``DotGeneral``)."""

  recipe: Any = dataclasses.field(kw_only=True)
  deterministic: bool = False
  backend: Backend = "auto"


class DenseGeneral(_RecipeDot, nn.DenseGeneral):
  """``nn.DenseGeneral`` whose contraction runs ``fp4jax.dot_general`` under ``recipe``."""

  recipe: Any = dataclasses.field(kw_only=True)
  deterministic: bool = False
  backend: Backend = "auto"


def einsum_layer(module: nn.Einsum, inputs, einsum_str, recipe: Any, deterministic: bool, backend: Backend = "auto"):
  """``nn.Einsum``'s computation (kernel, optional bias, dtype promotion) with ``fp4jax.einsum`` under ``recipe``
  and quantizer ``backend``.

  Called from inside ``module``'s compact ``__call__`` (its own, or the rule interceptor's); ``recipe=None`` runs
  ``jnp.einsum`` (high precision).
  """
  einsum_str = nn.merge_param("einsum_str", module.einsum_str, einsum_str).replace(" ", "")
  if "->" not in einsum_str or einsum_str.count(",") != 1:
    raise ValueError(f"einsum_str must be explicit ('->') with exactly two operands, got {einsum_str!r}")
  kernel = module.param("kernel", module.kernel_init, module.shape, module.param_dtype)
  bias = None
  if module.use_bias:
    bias_shape, broadcast_shape = module._get_bias_shape(einsum_str, inputs, kernel)
    bias = module.param("bias", module.bias_init, bias_shape, module.param_dtype)
  inputs, kernel, bias = module.promote_dtype(inputs, kernel, bias, dtype=module.dtype)
  if recipe is None:
    y = jnp.einsum(
      einsum_str, inputs, kernel, precision=module.precision, preferred_element_type=module.preferred_element_type
    )
  else:
    run, key = _key(module, recipe, deterministic, f"fp4jax Einsum at {_path(module)!r}")
    y = dot.einsum(
      einsum_str,
      inputs,
      kernel,
      recipe=run,
      key=key,
      precision=module.precision,
      preferred_element_type=module.preferred_element_type,
      backend=backend,
    )
  if bias is not None:
    y += jnp.reshape(bias, broadcast_shape)
  return y


class Einsum(nn.Einsum):
  """``nn.Einsum`` whose contraction runs ``fp4jax.einsum`` under ``recipe``."""

  recipe: Any = dataclasses.field(kw_only=True)
  deterministic: bool = False
  backend: Backend = "auto"

  def __post_init__(self):
    ops.check_backend(self.backend, "fp4jax.flax.linen.Einsum")
    super().__post_init__()

  @nn.compact
  def __call__(self, inputs, einsum_str: str | None = None):
    return einsum_layer(self, inputs, einsum_str, self.recipe, self.deterministic, self.backend)


# ------------------------------------------------------------------------------------------------ interception
class MoE(nn.Module):
  """Mixture-of-experts MLP: a float32 top-k router, the experts' two grouped GEMMs through ``fp4jax.ragged_dot``
  under ``recipe`` (tokens sorted by expert, combined back with the router weights; ``fp4jax._src.flax.moe``).

  Parameters: ``router/kernel`` [d, E] (float32 logits, no bias; not a Dense, so rules never quantize it:
  ``moe.router_logits``; initialized as ``nn.Dense``'s kernel), ``w_in`` [E, d, 2·hidden]
  ([gate | up] when ``gated``, else [E, d, hidden]) and ``w_out`` [E, hidden, d]. Each ragged GEMM draws its own
  "quant" key (as ``DotGeneral``). No load-balancing loss is computed.

  Attributes:
    num_experts: E.
    top_k: experts per token.
    hidden: each expert's hidden width.
    recipe: a name from ``fp4jax.recipes.names()`` or a ``fp4jax.recipes.Recipe`` (``"bf16"``: ``jax.lax.ragged_dot``).
    deterministic: evaluation mode (``fp4jax.recipes.deterministic(recipe)``, no "quant" stream needed).
    backend: ``fp4jax.ragged_dot``'s ``backend``.
    gated: SwiGLU-style experts, activation(gate) ⊙ up; else activation(W_in x).
    activation: the experts' nonlinearity.
    kernel_init: initializer of ``w_in`` and ``w_out`` (fan-in along axis 1, one matrix per expert).
    param_dtype: dtype of the parameters.
  """

  num_experts: int
  top_k: int
  hidden: int
  recipe: Any = dataclasses.field(kw_only=True)
  deterministic: bool = False
  backend: Backend = "auto"
  gated: bool = True
  activation: Callable[[jax.Array], jax.Array] = nn.silu
  kernel_init: Callable = nn.initializers.lecun_normal(in_axis=1, out_axis=2, batch_axis=(0,))
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., d] -> [..., d]."""
    d = x.shape[-1]
    e, width = self.num_experts, self.hidden * (2 if self.gated else 1)
    w_in = self.param("w_in", self.kernel_init, (e, d, width), self.param_dtype)
    w_out = self.param("w_out", self.kernel_init, (e, self.hidden, d), self.param_dtype)
    tokens = x.reshape(-1, d)
    logits = _Router(e, self.param_dtype, name="router")(tokens)
    where = f"fp4jax MoE at {_path(self)!r}"

    def grouped(lhs, rhs, sizes):
      run, key = _key(self, self.recipe, self.deterministic, where)
      return ragged.ragged_dot(lhs, rhs.astype(lhs.dtype), sizes, recipe=run, key=key, backend=self.backend)

    y = moe.experts_forward(
      tokens, logits, w_in, w_out, top_k=self.top_k, activation=self.activation, gated=self.gated, ragged=grouped
    )
    return y.reshape(x.shape).astype(x.dtype)


class _Router(nn.Module):
  """``moe.router_logits`` with its own ``kernel`` [d, E] (``nn.Dense``'s parameter name and initializer)."""

  features: int
  param_dtype: Any

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], self.features), self.param_dtype)
    return moe.router_logits(x, kernel)


def _path(module: nn.Module) -> str:
  return "/".join(str(p) for p in module.scope.path) if module.scope is not None else type(module).__name__


def own_recipe(module: nn.Module):
  """The recipe a layer was written with: its fp4jax ``dot_general_cls`` / ``recipe``, or None (plain dot)."""
  if isinstance(module, Einsum):
    return module.recipe
  cls = getattr(module, "dot_general_cls", None)
  return cls.keywords["recipe"] if _is_fp4jax_cls(cls) else None


def _call_args(module, args, kwargs):
  inputs = args[0] if args else kwargs["inputs"]
  einsum_str = args[1] if len(args) > 1 else kwargs.get("einsum_str")
  return inputs, einsum_str


def _flops(module, inputs, einsum_str) -> int:
  if isinstance(module, nn.Einsum):
    spec = nn.merge_param("einsum_str", module.einsum_str, einsum_str)
    return ops.einsum_flops(spec, inputs.shape, module.shape)
  features = module.features if isinstance(module.features, Sequence) else (module.features,)
  return 2 * math.prod(inputs.shape) * math.prod(features)  # Dense / DenseGeneral: each input meets each output


@contextlib.contextmanager
def _fields(module, **values):
  """Temporarily set frozen dataclass fields of a bound module (restored on exit)."""
  old = {k: getattr(module, k) for k in values}
  for k, v in values.items():
    object.__setattr__(module, k, v)
  try:
    yield
  finally:
    for k, v in old.items():
      object.__setattr__(module, k, v)


def interceptor(plan: dict[str, Any] | None, deterministic: bool, backend: Backend = "auto") -> Callable:
  """An ``nn.intercept_methods`` interceptor: records every linear layer call (``ops.record_dots``) and makes
  the layers in ``plan`` ({path: recipe or None}) run that recipe with quantizer ``backend``; other layers run as
  written."""

  def intercept(next_fun, args, kwargs, context):
    module = context.module
    if context.method_name != "__call__" or not isinstance(module, LAYERS):
      return next_fun(*args, **kwargs)
    path = _path(module)
    inputs, einsum_str = _call_args(module, args, kwargs)
    override = plan is not None and path in plan
    recipe = plan[path] if override else own_recipe(module)
    ops.record(path, type(module).__name__, recipe, _flops(module, inputs, einsum_str))
    if not override:
      return next_fun(*args, **kwargs)
    if isinstance(module, nn.Einsum):
      return einsum_layer(module, inputs, einsum_str, recipe, deterministic, backend)
    cls = None if recipe is None else _dot_general_cls(recipe, deterministic, backend)
    with _fields(module, dot_general_cls=cls, dot_general=None):
      return next_fun(*args, **kwargs)

  return intercept


@dataclasses.dataclass(frozen=True)
class QuantizedModule:
  """A linen module run under rules: ``init`` / ``apply`` / ``init_with_output`` as the module's own.

  Each call first traces the module abstractly (``jax.eval_shape``, cheap) to find its linear layers, resolves
  ``rules`` against their paths (``fp4jax.flax.rules.plan``), then runs it with the planned recipes. Parameters are
  the module's own (same tree), so a trained BF16 model can be quantized and vice versa. For evaluation use
  ``dataclasses.replace(qmodel, deterministic=True)``. ``backend``: the quantizer backend of the planned layers
  (``fp4jax.dot_general``'s).
  """

  module: nn.Module
  rules: Sequence[Any]
  defaults: Sequence[Any] = rules_lib.DEFAULT_HIGH_PRECISION
  deterministic: bool = False
  backend: Backend = "auto"

  def __post_init__(self):
    ops.check_backend(self.backend, "fp4jax.flax.linen.quantize")

  def plan(self, call: Callable[[], Any]) -> dict[str, Any]:
    """{path: recipe or None} for the layers the rules decide, found by tracing ``call`` (a thunk running the
    module)."""
    with ops.record_dots() as records, nn.intercept_methods(interceptor(None, False)):
      jax.eval_shape(call)
    return rules_lib.plan([r.path for r in records], self.rules, defaults=self.defaults)

  def run(self, call: Callable[[], Any]):
    with nn.intercept_methods(interceptor(self.plan(call), self.deterministic, self.backend)):
      return call()

  def init(self, rngs, *args, **kwargs):
    return self.run(lambda: self.module.init(rngs, *args, **kwargs))

  def init_with_output(self, rngs, *args, **kwargs):
    return self.run(lambda: self.module.init_with_output(rngs, *args, **kwargs))

  def apply(self, variables, *args, **kwargs):
    return self.run(lambda: self.module.apply(variables, *args, **kwargs))


def quantize(
  module: nn.Module,
  rules: Sequence[Any],
  *,
  defaults=rules_lib.DEFAULT_HIGH_PRECISION,
  deterministic: bool = False,
  backend: Backend = "auto",
) -> QuantizedModule:
  """``module`` with its linear layers quantized by ``rules`` (see ``QuantizedModule``, ``fp4jax.flax.rules``).

  Args:
    module: a ``flax.linen`` Module (not changed).
    rules: a sequence of ``Rule`` s and policies (``keep_high_precision``), resolved by ``fp4jax.flax.rules.plan``
      against the layer paths found when the module is traced.
    defaults: rules applied after ``rules`` (default: keep the output head in high precision).
    deterministic: run every recipe's deterministic variant (RTN, fixed Hadamard signs; for evaluation).
    backend: the quantizer backend of the planned layers (``fp4jax.dot_general``'s), one of ``fp4jax.Backend``.

  Returns:
    A ``QuantizedModule`` with ``init`` / ``apply`` / ``init_with_output`` as the module's own (same params tree).

  Raises:
    TypeError: ``module`` is not a linen Module.
    ValueError: ``backend`` is not one of ``fp4jax.Backend``'s names. (Rules are resolved, and their errors raised,
      when the returned module is called.)
  """
  if not isinstance(module, nn.Module):
    raise TypeError(f"module must be a flax.linen Module, got {type(module).__name__}")
  return QuantizedModule(module, tuple(rules), tuple(defaults), deterministic, backend)
