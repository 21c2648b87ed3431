"""Inference of a quantized linen or NNX model from its packed params (``fp4jax.flax.pack``), through
``fp4jax.packed_matmul``.

    qmodel = fp4jax.flax.quantize(model, rules)                 # linen: what the model was quantized with
    packed = fp4jax.flax.pack(variables["params"], qmodel)       # FP4 weights as QTensors
    y = fp4jax.flax.packed.apply(qmodel, {"params": packed}, x)  # no dequantized weight in HBM where a kernel runs

    fp4jax.flax.quantize(nnx_model, rules, rngs=...)             # NNX: quantized in place
    packed = fp4jax.flax.pack(nnx.state(nnx_model, nnx.Param).to_pure_dict(), nnx_model)
    y = fp4jax.flax.packed.apply_nnx(nnx_model, packed, x)

Both run the model with every quantized Dense / Linear whose kernel is a QTensor computed as
``packed_matmul(q(x), kernel) + bias`` (``linear``): ``q`` quantizes the layer's input as its recipe's forward
activation operand (``fwd_lhs``: format, rounding, block shape) in the weight's Hadamard domain (the weight's size
and sign rule), which is the forward the quantized model runs on ``unpack(packed)`` in evaluation mode
(``deterministic=True``); the two differ by fp32 rounding only (``packed_matmul`` multiplies the dequantized
operands at fp32, the quantized model's GEMM the bf16 values, then the tensor scales; an fp32 weight's tensor scale,
recomputed from the unpacked weight, may differ in its last bit). A packed layer that the model runs in high
precision computes ``x @ dequantize(kernel)``. Every other layer runs as the model runs it. Forward only (see
``fp4jax.packed_matmul``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx as flax_nnx
from flax import traverse_util

from fp4jax._src.backends import Backend
from fp4jax._src.flax import linen, nnx, ops
from fp4jax._src.formats import FP4Format
from fp4jax._src.matmul import packed_matmul
from fp4jax._src.quantize import QTensor, quantize


def activation_quantizer(recipe: Any, w: QTensor, where: str) -> dict | None:
  """``fp4jax.quantize`` keyword arguments of ``recipe``'s forward activation operand (deterministic variant) for
  a packed weight ``w``, or None when the recipe keeps activations in high precision.

  Raises:
    ValueError: activations in a format ``packed_matmul`` does not take (FP8, per-channel E2M1), outlier clipping,
      a Hadamard size other than ``w``'s, or random Hadamard signs.
  """
  spec = ops.effective(recipe, True, where).fwd_lhs
  if spec.fmt is None and spec.clip == "none":
    return None
  if not isinstance(spec.fmt, FP4Format) or spec.clip != "none":
    raise ValueError(
      f"{where}: recipe {ops.recipe_name(recipe)!r} quantizes activations as fmt={spec.fmt!r}, "
      f"clip={spec.clip!r}; packed inference takes block-scaled FP4 activations without clipping"
    )
  if (spec.hadamard or 0) != w.hadamard:
    raise ValueError(
      f"{where}: recipe {ops.recipe_name(recipe)!r} rotates activations with hadamard="
      f"{spec.hadamard} but the packed weight has hadamard={w.hadamard}"
    )
  if w.hadamard and spec.signs not in ("te", "none"):
    raise ValueError(
      f"{where}: recipe {ops.recipe_name(recipe)!r} rotates activations with {spec.signs!r} signs; "
      "packed inference needs fixed signs (the packed weight's)"
    )
  return {
    "fmt": spec.fmt,
    "rounding": spec.rounding,
    "block_shape": spec.block_shape,
    "hadamard": w.hadamard or None,
    "hadamard_signs": spec.signs if w.hadamard else "none",
  }


def linear(
  inputs: jax.Array,
  kernel: QTensor,
  bias: jax.Array | None,
  *,
  dtype: Any,
  recipe: Any,
  where: str,
  backend: Backend = "auto",
) -> jax.Array:
  """A Dense / Linear layer's output with its packed ``kernel``: ``packed_matmul(q(x), kernel) + bias``.

  Args:
    inputs: the layer's input [..., K].
    kernel: the packed (K, N) kernel.
    bias: the (N,) bias, or None.
    dtype: the layer's compute dtype (its ``dtype`` field); None: ``result_type(inputs, kernel)``, as the layer
      promotes them.
    recipe: the layer's recipe (``q`` is ``activation_quantizer``'s), or None: high precision, ``x @ dequantize(w)``.
    where: the layer, for errors.
    backend: ``packed_matmul``'s backend.

  Returns:
    [..., N] array of the compute dtype.

  Raises:
    ValueError: ``activation_quantizer``'s.
  """
  dtype = dtype or jnp.result_type(inputs.dtype, kernel.dtype)
  x = inputs.astype(dtype)
  kwargs = None if recipe is None else activation_quantizer(recipe, kernel, where)
  if kwargs is not None:
    x = quantize(x, axis=-1, **kwargs)
  y = packed_matmul(x, kernel, out_dtype=dtype, backend=backend)
  return y if bias is None else y + jnp.asarray(bias).astype(dtype)


# ------------------------------------------------------------------------------------------------ linen
def interceptor(backend: Backend = "auto"):
  """An ``nn.intercept_methods`` interceptor running every ``nn.Dense`` whose kernel is a QTensor by ``linear``, with
  the recipe the quantized model's own interceptor (entered before it, so run before it) gave the layer; other
  layers pass through."""

  def intercept(next_fun, args, kwargs, context):
    module = context.module
    if (
      context.method_name != "__call__"
      or not isinstance(module, linen.LAYERS)
      or not module.has_variable("params", "kernel")
    ):
      return next_fun(*args, **kwargs)
    kernel = module.get_variable("params", "kernel")
    if not isinstance(kernel, QTensor):
      return next_fun(*args, **kwargs)
    if type(module) not in (nn.Dense, linen.Dense):
      raise ValueError(
        f"fp4jax.flax.packed: layer {linen._path(module)!r} ({type(module).__name__}) has a packed "
        "kernel; packed inference runs nn.Dense layers (pack(params, rules) packs only those)"
      )
    inputs = args[0] if args else kwargs["inputs"]
    bias = module.get_variable("params", "bias") if module.use_bias else None
    return linear(
      inputs,
      kernel,
      bias,
      dtype=module.dtype,
      recipe=linen.own_recipe(module),
      where=f"fp4jax.flax.packed at {linen._path(module)!r}",
      backend=backend,
    )

  return intercept


def _abstract(variables):
  """``variables`` with each QTensor replaced by a ShapeDtypeStruct of its logical shape (for shape tracing)."""
  return jax.tree.map(
    lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype) if isinstance(v, QTensor) else v,
    variables,
    is_leaf=lambda v: isinstance(v, QTensor),
  )


def apply(qmodel: linen.QuantizedModule, variables, *args, backend: Backend = "auto", **kwargs):
  """``qmodel.apply(variables, *args, **kwargs)`` in evaluation mode, with packed Dense kernels (QTensors from
  ``fp4jax.flax.pack``) multiplied by ``fp4jax.packed_matmul`` (module docstring).

  Args:
    qmodel: the ``QuantizedModule`` the params were packed for (``fp4jax.flax.quantize`` of a linen model).
    variables: ``{"params": packed, ...}``.
    *args: the module's positional call arguments.
    **kwargs: the module's keyword call arguments.
    backend: ``packed_matmul``'s backend (``"auto"``: the FP4 GEMM kernels where they take the case, else XLA).

  Returns:
    The module's output.

  Raises:
    TypeError: ``qmodel`` is not a ``QuantizedModule``.
    ValueError: a packed kernel in a layer other than ``nn.Dense``; a recipe whose activations
      ``activation_quantizer`` does not take.
  """
  if not isinstance(qmodel, linen.QuantizedModule):
    raise TypeError(
      f"fp4jax.flax.packed.apply: qmodel must be the QuantizedModule the params were packed for "
      f"(fp4jax.flax.quantize(model, rules)), got {type(qmodel).__name__}"
    )
  ops.check_backend(backend, "fp4jax.flax.packed.apply")
  run = dataclasses.replace(qmodel, deterministic=True)
  module = run.module
  plan = run.plan(lambda: jax.eval_shape(lambda v: module.apply(v, *args, **kwargs), _abstract(variables)))
  # the interceptor entered last runs last: the packed one sees the recipe the quantized model's one set
  with nn.intercept_methods(linen.interceptor(plan, True, run.backend)), nn.intercept_methods(interceptor(backend)):
    return module.apply(variables, *args, **kwargs)


# ------------------------------------------------------------------------------------------------ NNX
class _PackedLinear(flax_nnx.Module):
  """An ``nnx.Linear`` of the model with its kernel packed: ``linear(inputs, kernel, bias)`` under its recipe."""

  def __init__(self, layer: flax_nnx.Linear, kernel: QTensor, recipe: Any, where: str, backend: Backend):
    self.kernel = flax_nnx.data(kernel)
    self.bias = layer.bias
    self.dtype, self.preferred_element_type = layer.dtype, layer.preferred_element_type
    self.recipe, self.where, self.backend = recipe, where, backend

  def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
    if out_sharding is not None:
      raise NotImplementedError(f"{self.where}: packed inference does not take out_sharding; got {out_sharding!r}")
    bias = None if self.bias is None else self.bias[...]
    return linear(
      inputs, self.kernel, bias, dtype=self.dtype, recipe=self.recipe, where=self.where, backend=self.backend
    )


def _linear_recipe(layer: flax_nnx.Module, path: str, where: str) -> Any:
  """The recipe ``layer`` (at ``path``, holding a packed kernel) runs, or None; raises where packed inference would
  not compute what the layer computes."""
  if type(layer) not in (flax_nnx.Linear, nnx.Linear):
    raise ValueError(
      f"{where}: layer {path!r} ({type(layer).__name__}) has a packed kernel; packed inference runs "
      "nnx.Linear layers (pack(params, model) packs only those)"
    )
  if layer.preferred_element_type is not None:
    raise ValueError(
      f"{where}: layer {path!r} sets preferred_element_type={layer.preferred_element_type}; packed "
      "inference computes in the layer's dtype"
    )
  op = layer.dot_general
  if not isinstance(op, nnx.DotGeneral) and op is not jax.lax.dot_general:
    raise ValueError(
      f"{where}: layer {path!r} multiplies with a custom dot_general ({op!r}); packed inference "
      "replaces only lax.dot_general and fp4jax's DotGeneral"
    )
  return nnx.layer_recipe(layer)


def _set_child(parent: Any, key: Any, child: Any, where: str) -> None:
  if isinstance(parent, flax_nnx.Module):
    setattr(parent, key, child)
  elif isinstance(parent, (list, dict, flax_nnx.List, flax_nnx.Dict)):
    parent[key] = child
  else:
    raise TypeError(
      f"{where}: cannot replace a packed layer held in a {type(parent).__name__}; hold layers in "
      "Modules, lists, dicts, nnx.List or nnx.Dict"
    )


def _packed_copy(model: flax_nnx.Module, packed: Mapping, backend: Backend, where: str) -> flax_nnx.Module:
  """A copy of ``model`` holding ``packed``'s arrays, every packed Linear replaced by a ``_PackedLinear``, every
  fp4jax op deterministic."""
  run = flax_nnx.clone(model)
  flat = traverse_util.flatten_dict(packed.to_pure_dict() if hasattr(packed, "to_pure_dict") else dict(packed))
  kernels = {k: v for k, v in flat.items() if isinstance(v, QTensor)}
  state = flax_nnx.state(run, flax_nnx.Param)
  try:
    flax_nnx.replace_by_pure_dict(
      state, traverse_util.unflatten_dict({k: v for k, v in flat.items() if k not in kernels})
    )
  except ValueError as err:
    raise ValueError(f"{where}: packed holds a leaf the model has no param for ({err})") from err
  flax_nnx.update(run, state)
  nodes = {tuple(str(p) for p in path): (path, node) for path, node in flax_nnx.iter_graph(run)}
  layers = nnx.layers(run)
  for key, kernel in kernels.items():
    path = "/".join(str(p) for p in key[:-1])
    if key[-1] != "kernel" or path not in layers:
      raise ValueError(
        f"{where}: {'/'.join(str(p) for p in key)!r} is a QTensor but not the kernel of a linear "
        f"layer of the model; layers: {list(layers)}"
      )
    layer = layers[path]
    recipe = _linear_recipe(layer, path, where)
    if kernel.shape != layer.kernel.shape:
      raise ValueError(
        f"{where}: the packed kernel of layer {path!r} has shape {kernel.shape}, the layer's kernel "
        f"{layer.kernel.shape}"
      )
    layer_path = nodes[tuple(str(p) for p in key[:-1])][0]
    parent = nodes[tuple(str(p) for p in layer_path[:-1])][1]
    _set_child(parent, layer_path[-1], _PackedLinear(layer, kernel, recipe, f"{where} at {path!r}", backend), where)
  for _, node in flax_nnx.iter_graph(run):
    if isinstance(node, (nnx.DotGeneral, nnx.EinsumOp)):
      node.deterministic = True
  return run


def apply_nnx(model: flax_nnx.Module, packed: Mapping, *args, backend: Backend = "auto", **kwargs):
  """``model(*args, **kwargs)`` on the params ``packed``, with every fp4jax op deterministic and every packed
  ``nnx.Linear`` kernel (a QTensor from ``fp4jax.flax.pack``) multiplied by ``fp4jax.packed_matmul`` (module
  docstring). ``model`` is not changed: the forward runs on a copy (other modules run as ``model`` is set, e.g.
  ``model.eval()`` for dropout).

  Args:
    model: the NNX model the params were packed for, quantized by ``fp4jax.flax.quantize`` (each layer's recipe
      decides how its activations are quantized).
    packed: ``fp4jax.flax.pack(nnx.state(model, nnx.Param).to_pure_dict(), model)``, or any subset of the model's
      params as a nested dict (leaves not given keep the model's values).
    *args: the model's positional call arguments.
    **kwargs: the model's keyword call arguments.
    backend: ``packed_matmul``'s backend (``"auto"``: the FP4 GEMM kernels where they take the case, else XLA).

  Returns:
    The model's output.

  Raises:
    TypeError: ``model`` is not an NNX Module; a packed layer held in a tuple (it cannot be replaced).
    ValueError: a key of ``packed`` that is not a param of ``model``; a QTensor that is not the kernel of an
      ``nnx.Linear`` (or fp4jax ``Linear``) using ``lax.dot_general`` or fp4jax's ``DotGeneral`` without
      ``preferred_element_type``; a recipe whose activations ``activation_quantizer`` does not take.
  """
  if not isinstance(model, flax_nnx.Module):
    raise TypeError(
      f"fp4jax.flax.packed.apply_nnx: model must be the flax.nnx Module the params were packed for, "
      f"got {type(model).__name__}"
    )
  ops.check_backend(backend, "fp4jax.flax.packed.apply_nnx")
  return _packed_copy(model, packed, backend, "fp4jax.flax.packed.apply_nnx")(*args, **kwargs)
