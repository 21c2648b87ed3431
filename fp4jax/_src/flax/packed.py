"""Inference of a linen model from its packed params (``fp4jax.flax.pack``), through ``fp4jax.packed_matmul``.

    qmodel = fp4jax.flax.quantize(model, rules)                 # what the model was trained / quantized with
    packed = fp4jax.flax.pack(variables["params"], qmodel)       # FP4 weights as QTensors
    y = fp4jax.flax.packed.apply(qmodel, {"params": packed}, x)  # no dequantized weight in HBM where a kernel runs

``apply`` runs ``qmodel`` in evaluation mode (``deterministic=True``) with every ``nn.Dense`` whose kernel is a
QTensor computed as ``packed_matmul(q(x), kernel) + bias``: ``q`` quantizes the layer's input as its recipe's
forward activation operand (``fwd_lhs``: format, rounding, block shape) in the weight's Hadamard domain (the
weight's size and sign rule), which is the forward the quantized model runs on ``unpack(packed)``; the two differ by
fp32 rounding only (``packed_matmul`` multiplies the dequantized operands at fp32, the quantized model's GEMM the
bf16 values, then the tensor scales; an fp32 weight's tensor scale, recomputed from the unpacked weight, may differ
in its last bit). A packed Dense that the plan runs in high precision computes ``x @ dequantize(kernel)``. Every
other layer runs as ``qmodel`` runs it. Forward only (see ``fp4jax.packed_matmul``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fp4jax._src.backends import Backend
from fp4jax._src.flax import linen, ops
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
    raise ValueError(f"{where}: recipe {ops.recipe_name(recipe)!r} quantizes activations as fmt={spec.fmt!r}, "
                     f"clip={spec.clip!r}; packed inference takes block-scaled FP4 activations without clipping")
  if (spec.hadamard or 0) != w.hadamard:
    raise ValueError(f"{where}: recipe {ops.recipe_name(recipe)!r} rotates activations with hadamard="
                     f"{spec.hadamard} but the packed weight has hadamard={w.hadamard}")
  if w.hadamard and spec.signs not in ("te", "none"):
    raise ValueError(f"{where}: recipe {ops.recipe_name(recipe)!r} rotates activations with {spec.signs!r} signs; "
                     "packed inference needs fixed signs (the packed weight's)")
  return {"fmt": spec.fmt, "rounding": spec.rounding, "block_shape": spec.block_shape, "hadamard": w.hadamard or None,
          "hadamard_signs": spec.signs if w.hadamard else "none"}


def dense(module: nn.Dense, inputs: jax.Array, kernel: QTensor, recipe: Any, backend: Backend = "auto") -> jax.Array:
  """``nn.Dense``'s output with its packed ``kernel``: inputs cast as ``nn.Dense`` promotes them, quantized by
  ``activation_quantizer`` (when ``recipe`` quantizes), times the packed kernel, plus the bias."""
  where = f"fp4jax.flax.packed at {linen._path(module)!r}"
  dtype = module.dtype or jnp.result_type(inputs.dtype, kernel.dtype)
  x = inputs.astype(dtype)
  kwargs = None if recipe is None else activation_quantizer(recipe, kernel, where)
  if kwargs is not None:
    x = quantize(x, axis=-1, **kwargs)
  y = packed_matmul(x, kernel, out_dtype=dtype, backend=backend)
  if module.use_bias:
    y = y + jnp.asarray(module.get_variable("params", "bias")).astype(dtype)
  return y


def interceptor(backend: Backend = "auto"):
  """An ``nn.intercept_methods`` interceptor running every ``nn.Dense`` whose kernel is a QTensor by ``dense``, with
  the recipe the quantized model's own interceptor (entered before it, so run before it) gave the layer; other
  layers pass through."""

  def intercept(next_fun, args, kwargs, context):
    module = context.module
    if context.method_name != "__call__" or not isinstance(module, linen.LAYERS) or not module.has_variable(
        "params", "kernel"):
      return next_fun(*args, **kwargs)
    kernel = module.get_variable("params", "kernel")
    if not isinstance(kernel, QTensor):
      return next_fun(*args, **kwargs)
    if type(module) not in (nn.Dense, linen.Dense):
      raise ValueError(f"fp4jax.flax.packed: layer {linen._path(module)!r} ({type(module).__name__}) has a packed "
                       "kernel; packed inference runs nn.Dense layers (pack(params, rules) packs only those)")
    inputs = args[0] if args else kwargs["inputs"]
    return dense(module, inputs, kernel, linen.own_recipe(module), backend)

  return intercept


def _abstract(variables):
  """``variables`` with each QTensor replaced by a ShapeDtypeStruct of its logical shape (for shape tracing)."""
  return jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype) if isinstance(v, QTensor) else v, variables,
                      is_leaf=lambda v: isinstance(v, QTensor))


def apply(qmodel: linen.QuantizedModule, variables, *args, backend: Backend = "auto", **kwargs):
  """``qmodel.apply(variables, *args, **kwargs)`` in evaluation mode, with packed Dense kernels (QTensors from
  ``fp4jax.flax.pack``) multiplied by ``fp4jax.packed_matmul`` (module docstring).

  Args:
    qmodel: the ``QuantizedModule`` the params were packed for (``fp4jax.flax.quantize`` of a linen model).
    variables: ``{"params": packed, ...}``.
    *args, **kwargs: the module's call arguments.
    backend: ``packed_matmul``'s backend (``"auto"``: the FP4 GEMM kernels where they take the case, else XLA).

  Returns:
    The module's output.

  Raises:
    TypeError: ``qmodel`` is not a ``QuantizedModule``.
    ValueError: a packed kernel in a layer other than ``nn.Dense``; a recipe whose activations
      ``activation_quantizer`` does not take.
  """
  if not isinstance(qmodel, linen.QuantizedModule):
    raise TypeError(f"fp4jax.flax.packed.apply: qmodel must be the QuantizedModule the params were packed for "
                    f"(fp4jax.flax.quantize(model, rules)), got {type(qmodel).__name__}")
  ops.check_backend(backend, "fp4jax.flax.packed.apply")
  run = dataclasses.replace(qmodel, deterministic=True)
  module = run.module
  plan = run.plan(lambda: jax.eval_shape(lambda v: module.apply(v, *args, **kwargs), _abstract(variables)))
  # the interceptor entered last runs last: the packed one sees the recipe the quantized model's one set
  with nn.intercept_methods(linen.interceptor(plan, True, run.backend)), nn.intercept_methods(interceptor(backend)):
    return module.apply(variables, *args, **kwargs)
