"""``summary``: which linear layers of a model run which recipe, and the share of linear-layer FLOPs in FP4.

The model is traced abstractly (``jax.eval_shape``: no FLOPs are spent) and every call of a linear layer (linen
Dense/DenseGeneral/Einsum, NNX Linear/LinearGeneral/Einsum) is recorded with its recipe and its FLOPs,
2 · (multiply-adds) of its dot. A recipe counts as FP4 when its forward operands are E2M1 (NVFP4, MXFP4 or
Microsoft's per-channel E2M1); bf16, fp8 and high-precision layers do not.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
from flax import nnx as flax_nnx

from fp4jax._src import recipes
from fp4jax._src.flax import linen, nnx, ops
from fp4jax._src.formats import FP4Format


def is_fp4(recipe: Any) -> bool:
  """True when the recipe's forward GEMM multiplies E2M1 operands."""
  if recipe is None or recipe == ops.HIGH_PRECISION:
    return False
  r = ops.resolve(recipe, "summary")
  return any(isinstance(s.fmt, FP4Format) or s.fmt == recipes.E2M1_CHANNEL for s in r.operands("fwd"))


@dataclasses.dataclass(frozen=True)
class LayerSummary:
  """The recorded layer calls (path, kind, recipe, FLOPs), in call order."""

  records: tuple[ops.DotRecord, ...]

  @property
  def total_flops(self) -> int:
    return sum(r.flops for r in self.records)

  @property
  def fp4_flops(self) -> int:
    return sum(r.flops for r in self.records if is_fp4(r.recipe))

  @property
  def fp4_share(self) -> float:
    """FP4 FLOPs / all linear-layer FLOPs (0 for a model without linear layers)."""
    return self.fp4_flops / self.total_flops if self.total_flops else 0.0

  def recipes(self) -> dict[str, str]:
    """{layer path: recipe name or "high precision"}."""
    return {r.path: r.recipe for r in self.records}

  def __str__(self) -> str:
    w = max([len(r.path) for r in self.records] + [5])
    lines = [f"{'layer':<{w}}  {'kind':<13} {'recipe':<15} {'FLOPs':>10}  FP4"]
    for r in self.records:
      lines.append(
        f"{r.path:<{w}}  {r.kind:<13} {r.recipe:<15} {r.flops:>10.3g}  {'yes' if is_fp4(r.recipe) else 'no'}"
      )
    lines.append(
      f"FP4 share of linear-layer FLOPs: {100 * self.fp4_share:.1f}% "
      f"({self.fp4_flops:.3g} of {self.total_flops:.3g} FLOPs, {len(self.records)} layer calls)"
    )
    return "\n".join(lines)


def summary(model, *args, rngs=None, show: bool = True, **kwargs) -> LayerSummary:
  """Trace ``model`` on ``args`` / ``kwargs`` and summarize its linear layers; prints the table when ``show``.

  Args:
    model: a linen Module (traced through ``init``), a ``fp4jax.flax.linen.QuantizedModule``, or an NNX Module
      (traced through ``model(*args, **kwargs)``).
    *args: the model's positional call arguments.
    rngs: the ``init`` RNGs of a linen model; None means ``jax.random.key(0)``. Unused for NNX.
    show: print the table.
    **kwargs: the model's keyword call arguments.

  Returns:
    A ``LayerSummary``: each linear layer call's path, kind, recipe and FLOPs, in call order.

  Raises:
    TypeError: ``model`` is none of the three kinds.
  """
  if isinstance(model, (nn.Module, linen.QuantizedModule)):
    records = _linen_records(model, args, kwargs, jax.random.key(0) if rngs is None else rngs)
  elif isinstance(model, flax_nnx.Module):
    records = _nnx_records(model, args, kwargs)
  else:
    raise TypeError(f"model must be a linen Module, a QuantizedModule or an NNX Module, got {type(model).__name__}")
  result = LayerSummary(tuple(records))
  if show:
    print(result)
  return result


def _linen_records(model, args, kwargs, rngs):
  with ops.record_dots() as records:
    if isinstance(model, linen.QuantizedModule):
      jax.eval_shape(lambda: model.init(rngs, *args, **kwargs))
    else:
      with nn.intercept_methods(linen.interceptor(None, False)):
        jax.eval_shape(lambda: model.init(rngs, *args, **kwargs))
  return records


@dataclasses.dataclass(frozen=True)
class _PlainRecorder:
  """A plain dot (``lax.dot_general`` / ``jnp.einsum``) that records its call as high precision."""

  fn: Callable
  path: str
  kind: str

  def __call__(self, *args, **kwargs):
    if self.kind == "einsum":
      spec, lhs, rhs = args[:3]
      flops = ops.einsum_flops(spec, lhs.shape, rhs.shape)
    else:
      lhs, rhs, dims = args[:3]
      flops = ops.dot_general_flops(lhs.shape, rhs.shape, dims)
    ops.record(self.path, self.kind, None, flops)
    return self.fn(*args, **kwargs)


@contextlib.contextmanager
def _nnx_recording(model):
  """Name every fp4jax op by its layer path and wrap plain dots in recorders; undone on exit."""
  restore = []
  for path, layer in nnx.layers(model).items():
    attr = nnx._op_attr(layer)
    op = getattr(layer, attr)
    if isinstance(op, nnx._QuantOp):
      restore.append((op, "path", op.path))
      op.path = path
    elif not (isinstance(layer, flax_nnx.LinearGeneral) and layer.dot_general_cls is not None):
      restore.append((layer, attr, op))
      setattr(layer, attr, _PlainRecorder(op, path, "einsum" if attr == "einsum_op" else "dot_general"))
  try:
    yield
  finally:
    for obj, attr, value in reversed(restore):
      setattr(obj, attr, value)


def _nnx_records(model, args, kwargs):
  with ops.record_dots() as records, _nnx_recording(model):
    flax_nnx.eval_shape(lambda m, *a: m(*a, **kwargs), model, *args)
  return records
