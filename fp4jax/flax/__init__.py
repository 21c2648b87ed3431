"""Flax integration: FP4 layers for linen and NNX, rule-based quantization of existing models, summary, export.

Modules: ``linen`` (DotGeneral, Dense, DenseGeneral, Einsum, quantize), ``nnx`` (DotGeneral, EinsumOp, Linear,
Einsum, quantize), ``rules`` (Rule, keep_high_precision, plan), ``summary`` (which layers run which recipe, FP4
share of linear FLOPs), ``export`` (packed FP4 weights as QTensors, orbax save/restore), ``packed`` (inference of
a quantized model from its packed params: ``packed.apply`` for linen, ``packed.apply_nnx`` / ``apply_packed_nnx`` for
NNX).
"""

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
from flax import nnx as _nnx

from fp4jax._src.flax.export import pack, restore, save, unpack
from fp4jax._src.flax.packed import apply_nnx as apply_packed_nnx
from fp4jax._src.flax.rules import DEFAULT_HIGH_PRECISION, Rule, keep_high_precision
from fp4jax._src.flax.summary import LayerSummary, summary
from fp4jax.flax import export, linen, nnx, packed, rules


def quantize(model, rules: Sequence[Any], **kwargs):
  """Quantize an existing linen or NNX model by ``rules``.

  ``linen.quantize`` for linen Modules (returns a ``QuantizedModule`` with ``init`` / ``apply``), ``nnx.quantize``
  for NNX Modules (in place; pass ``rngs=nnx.Rngs(quant=...)``).

  Args:
    model: a ``flax.linen`` or ``flax.nnx`` Module.
    rules: a sequence of ``Rule`` s and policies (``keep_high_precision``).
    **kwargs: keyword arguments of ``fp4jax.flax.linen.quantize`` or ``fp4jax.flax.nnx.quantize`` (``defaults``,
      ``deterministic``, ``backend``; NNX also ``rngs``).

  Returns:
    The linen ``QuantizedModule``, or the NNX ``model`` itself.

  Raises:
    TypeError: ``model`` is neither a linen nor an NNX Module.
    ValueError: as ``linen.quantize`` / ``nnx.quantize``.
  """
  if isinstance(model, nn.Module):
    return linen.quantize(model, rules, **kwargs)
  if isinstance(model, _nnx.Module):
    return nnx.quantize(model, rules, **kwargs)
  raise TypeError(f"model must be a flax.linen or flax.nnx Module, got {type(model).__name__}")


__all__ = [
  "DEFAULT_HIGH_PRECISION",
  "LayerSummary",
  "Rule",
  "apply_packed_nnx",
  "export",
  "keep_high_precision",
  "linen",
  "nnx",
  "pack",
  "packed",
  "quantize",
  "restore",
  "rules",
  "save",
  "summary",
  "unpack",
]
