"""What linen and NNX layers share: resolving a recipe, the deterministic variant, keys, and FLOP records.

A layer holds a recipe (a name from ``fp4jax.recipes.names()`` or a ``fp4jax.recipes.Recipe``) and a
``deterministic`` flag. In training (``deterministic=False``) a random recipe draws one key per call from the
framework's "quant" RNG stream; in evaluation (``deterministic=True``) it runs ``fp4jax.recipes.deterministic(recipe)``
(stochastic roundings become RTN, fresh Hadamard signs become fixed ones) and needs no key.

``record_dots()`` collects, while active, one ``DotRecord`` per quantizable layer call (path, recipe name, FLOPs);
``fp4jax.flax.summary`` is built on it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from fp4jax._src import backends, recipes

QUANT_STREAM = "quant"
HIGH_PRECISION = "high precision"


def resolve(recipe: Any, where: str):
  """``recipe`` (name or Recipe) -> Recipe; unknown names raise a ValueError naming ``where`` and the valid names."""
  if isinstance(recipe, recipes.Recipe):
    return recipe
  if not isinstance(recipe, str):
    raise TypeError(f"{where}: recipe must be a recipe name or fp4jax.recipes.Recipe, got {recipe!r}")
  if recipe not in recipes.names():
    raise ValueError(f"{where}: unknown recipe {recipe!r}; expected one of {sorted(recipes.names())}")
  return recipes.get(recipe)


def check_backend(backend: Any, where: str) -> None:
  """ValueError naming ``where``'s ``backend`` argument unless it is one of ``fp4jax.backends.Backend``'s names."""
  backends.check(backend, where)


def recipe_name(recipe: Any) -> str:
  """Display name of a recipe (its ``name`` field when it has one)."""
  if recipe is None:
    return HIGH_PRECISION
  return recipe if isinstance(recipe, str) else str(getattr(recipe, "name", recipe))


def effective(recipe: Any, deterministic: bool, where: str):
  """The Recipe a call runs: ``recipe`` itself, or its deterministic variant when ``deterministic`` is True."""
  r = resolve(recipe, where)
  if deterministic and r.is_random:
    r = recipes.deterministic(r)
  return r


def missing_stream_error(where: str, recipe: Any, how: str) -> ValueError:
  return ValueError(
    f"{where}: recipe {recipe_name(recipe)!r} draws random bits (stochastic rounding or fresh Hadamard signs) from "
    f"the {QUANT_STREAM!r} RNG stream, and none was given: {how}, or use deterministic=True for evaluation "
    "(RTN and fixed signs)"
  )


# ------------------------------------------------------------------------------------------------ FLOP records
@dataclasses.dataclass(frozen=True)
class DotRecord:
  """One call of a quantizable layer: its path, recipe name (or "high precision") and FLOPs (2 per multiply-add)."""

  path: str
  kind: str
  recipe: str
  flops: int


_RECORDS: contextvars.ContextVar[list | None] = contextvars.ContextVar("fp4jax_flax_records", default=None)


@contextlib.contextmanager
def record_dots() -> Iterator[list[DotRecord]]:
  """Within the block, quantizable layer calls append a ``DotRecord`` to the yielded list (at trace time)."""
  records: list[DotRecord] = []
  token = _RECORDS.set(records)
  try:
    yield records
  finally:
    _RECORDS.reset(token)


def record(path: str, kind: str, recipe: Any, flops: int) -> None:
  records = _RECORDS.get()
  if records is not None:
    records.append(DotRecord(path, kind, recipe_name(recipe), int(flops)))


def dot_general_flops(lhs_shape, rhs_shape, dimension_numbers) -> int:
  """2 · batch · lhs-free · rhs-free · contraction sizes of a ``lax.dot_general``."""
  (_, rc), (_, rb) = dimension_numbers
  rhs_free = math.prod(d for i, d in enumerate(rhs_shape) if i not in set(rc) | set(rb))
  return 2 * math.prod(lhs_shape) * rhs_free


def einsum_flops(spec: str, lhs_shape, rhs_shape) -> int:
  """2 · (output size) · (sizes of the indices summed over) of a two-operand einsum (``...`` allowed)."""
  inputs, out = spec.replace(" ", "").split("->")
  a, b = inputs.split(",")
  sizes: dict[str, int] = {}
  batch = 1
  for labels, shape in ((a, lhs_shape), (b, rhs_shape)):
    n_ellipsis = len(shape) - len(labels.replace("...", ""))
    if "..." in labels:
      batch = max(batch, math.prod(shape[labels.index("...") : labels.index("...") + n_ellipsis]))
    for ch, d in zip(labels.replace("...", "." * n_ellipsis), shape):
      if ch != ".":
        sizes[ch] = d
  out_size = batch * math.prod(sizes[c] for c in out.replace("...", ""))
  summed = math.prod(d for c, d in sizes.items() if c in a and c in b and c not in out)
  return 2 * out_size * summed
