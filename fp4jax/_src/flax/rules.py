"""Rules: which layers of an existing model run which recipe, chosen by regular expressions on module paths.

A layer's path is its module names joined by "/" (linen: ``block_0/attn/q``; NNX: attribute names and list
indices, ``blocks/0/attn/q``). The quantizable layers are the ones that own a weight and one dot: linen ``Dense``,
``DenseGeneral``, ``Einsum``; NNX ``Linear``, ``LinearGeneral``, ``Einsum``. Embeddings, norms and the attention
score/value products (activation x activation, computed by attention functions, not by these layers) are never
quantized by rules.

Resolution (``plan``), per candidate path: the first of ``rules`` (in order, policies expanded) whose pattern
``re.fullmatch``-es the path decides it, before the defaults, so a rule naming the LM head (``Rule("lm_head", ...)``)
quantizes it. A catch-all rule (one matching every candidate path, such as ``.*``) yields to the defaults: a path it
decides that a default matches is decided by that default. A path no user rule matches is decided by the first
matching default. A rule with ``recipe=None`` keeps the layer in high precision; a layer nothing matches is left as
the model defines it. ``DEFAULT_HIGH_PRECISION`` keeps the LM head (a layer named ``lm_head``, ``logits`` or
``unembed`` anywhere, or a top-level ``head`` / ``output``; an ``attn/output`` projection is not an LM head) in high
precision as every published FP4 recipe does; pass ``defaults=()`` to let catch-all rules decide it too. A rule
that matches no candidate, names an unknown recipe, or decides no layer (every layer it matches decided by an earlier
rule or a default) is an error: a typo must not silently train in high precision. Rules that quantize no layer at
all (``rules=[]``) warn.

Policies expand into rules once the candidate paths are known: ``keep_high_precision(first=k, last=m)`` keeps the
layers of the first k and last m blocks in high precision (NVIDIA's NVFP4 recipe, arXiv 2509.25149: the 12B
model kept the first 2 and last 8 of 62 blocks, ~16% of its linear layers).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from fp4jax._src.flax import ops

DEFAULT_BLOCK_PATTERN = r"(?:^|.*/)(?:blocks?|layers?|h)[_/](\d+)(?:/.*)?"


@dataclasses.dataclass(frozen=True)
class Rule:
  """Layers whose path ``re.fullmatch``-es ``pattern`` run ``recipe`` (a name or Recipe; None = high precision)."""

  pattern: str
  recipe: Any

  def __post_init__(self):
    try:
      re.compile(self.pattern)
    except re.error as err:
      raise ValueError(f"Rule.pattern {self.pattern!r} is not a valid regular expression: {err}") from err
    if self.recipe is not None:
      ops.resolve(self.recipe, f"Rule({self.pattern!r})")

  def matches(self, path: str) -> bool:
    return re.fullmatch(self.pattern, path) is not None

  def expand(self, paths: Sequence[str]) -> tuple[Rule, ...]:
    del paths
    return (self,)


@dataclasses.dataclass(frozen=True)
class KeepHighPrecision:
  """Policy: the layers of the first ``first`` and last ``last`` blocks stay in high precision.

  A layer's block index is the first group of ``block_pattern`` on its path; the number of blocks is one more
  than the largest index among the candidate paths. Layers outside numbered blocks are left to later rules.
  """

  first: int = 0
  last: int = 0
  block_pattern: str = DEFAULT_BLOCK_PATTERN

  def __post_init__(self):
    if self.first < 0 or self.last < 0:
      raise ValueError(f"keep_high_precision: first and last must be >= 0, got first={self.first}, last={self.last}")

  def expand(self, paths: Sequence[str]) -> tuple[Rule, ...]:
    index = {}
    for p in paths:
      m = re.fullmatch(self.block_pattern, p)
      if m:
        index[p] = int(m.group(1))
    if not index:
      raise ValueError(
        f"keep_high_precision: no layer path matches block_pattern {self.block_pattern!r} (a block index must "
        f"appear in the path; layers under nn.scan share one path and cannot be told apart); paths: {list(paths)}"
      )
    n_blocks = max(index.values()) + 1
    if self.first + self.last > n_blocks:
      raise ValueError(f"keep_high_precision(first={self.first}, last={self.last}) exceeds the {n_blocks} blocks found")
    kept = [p for p, i in index.items() if i < self.first or i >= n_blocks - self.last]
    return tuple(Rule(re.escape(p), None) for p in kept)


def keep_high_precision(first: int = 0, last: int = 0, *, block_pattern: str = DEFAULT_BLOCK_PATTERN):
  """The policy ``KeepHighPrecision(first, last, block_pattern)``; put it before the rules that quantize.

  The layers of the first ``first`` and last ``last`` numbered blocks stay in high precision; a layer's block index is
  the first group of ``block_pattern`` on its path.

  Args:
    first: how many leading blocks to keep, >= 0.
    last: how many trailing blocks to keep, >= 0.
    block_pattern: a regular expression matched (``re.fullmatch``) against layer paths, whose first group is the
      block index (default: ``block_N`` / ``blocks/N`` / ``layers_N`` / ``h_N`` and similar).

  Returns:
    A ``KeepHighPrecision`` policy.

  Raises:
    ValueError: ``first`` or ``last`` is negative. (When the rules are planned: no path matches ``block_pattern``,
      or ``first + last`` exceeds the blocks found.)
  """
  return KeepHighPrecision(first, last, block_pattern)


DEFAULT_HIGH_PRECISION = (Rule(r"(?:.*/)?(?:lm_head|logits|unembed)|head|output", None),)


def plan(
  paths: Sequence[str], rules: Sequence[Any], *, defaults: Sequence[Any] = DEFAULT_HIGH_PRECISION
) -> dict[str, Any]:
  """{path: recipe, or None for high precision} of the candidate paths some rule or default decides.

  Args:
    paths: the candidate layer paths ("/"-joined module names), in model order.
    rules: ``Rule``s, ``(pattern, recipe)`` pairs or policies (``keep_high_precision``), in priority order.
    defaults: rules consulted after ``rules``, and before a catch-all rule (see the module docstring).

  Returns:
    {path: recipe or None} for the decided paths; undecided paths are absent (left as the model defines them).

  Raises:
    ValueError: no candidate path; a ``Rule`` matching no candidate path; a rule or policy deciding no layer.
    TypeError: ``rules`` is not a sequence of rules / policies.
  """
  if isinstance(rules, (Rule, KeepHighPrecision)) or isinstance(rules, Mapping):
    raise TypeError(f"rules must be a sequence of Rule / policies, got {rules!r}")
  paths = list(dict.fromkeys(paths))
  if not paths:
    raise ValueError(
      "the model has no quantizable layer (linen Dense/DenseGeneral/Einsum, NNX Linear/LinearGeneral/Einsum)"
    )
  items = [_item(item, paths) for item in rules]
  owned = [(i, r) for i, item in enumerate(items) for r in item.expand(paths)]  # (index of its item, rule)
  fallback = [r for d in defaults for r in d.expand(paths)]
  result, deciders = {}, set()
  for p in paths:
    i, hit = next(((i, r) for i, r in owned if r.matches(p)), (None, None))
    default = next((r for r in fallback if r.matches(p)), None)
    if hit is None or (default is not None and all(hit.matches(q) for q in paths)):
      i, hit = None, default
    if hit is not None:
      result[p] = hit.recipe
      deciders.add(i)
  for i, item in enumerate(items):
    if i not in deciders:
      raise ValueError(
        f"rules[{i}] = {item!r} decides no layer: every layer it matches is decided by an earlier rule "
        f"or, for a catch-all rule, by a default ({list(defaults)}); the plan is {result}"
      )
  if all(r is None for r in result.values()):
    warnings.warn(
      f"fp4jax.flax rules {list(rules)!r} quantize no layer: the model runs in high precision", stacklevel=2
    )
  return result


def _item(item: Any, paths: Sequence[str]):
  """A rules entry as a Rule or policy; a Rule must match some candidate path."""
  item = Rule(*item) if isinstance(item, tuple) else item
  if not hasattr(item, "expand"):
    raise TypeError(f"rules: expected Rule or a policy such as keep_high_precision(...), got {item!r}")
  if isinstance(item, Rule) and not any(item.matches(p) for p in paths):
    raise ValueError(f"rule {item!r} matches no quantizable layer; the layer paths are {paths}")
  return item
