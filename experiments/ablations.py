"""Recipes of the controlled experiments: a published recipe with one choice changed, for ``--recipe module:attr``.

  fp4jax-sweep ... --recipes ms_fp4 fp4jax_experiments.ablations:ms_fp4_ste --seeds 0 1 2

``ms_fp4_ste``: Microsoft FP4 with W's gradient straight through (STE) instead of the differentiable gradient
estimator (DGE): whether ms_fp4's early lead over BF16 comes from DGE. ``quartet_quest_nearest``: Quartet with QuEST's
forward scale 2^round(log2(0.48708·σ_b)) (nearest) instead of 2^floor(...): with floor, the trust mask zeroes the
gradient of about 7.3% of Gaussian entries, 0.33% with nearest. (The per-token amax of the third question is
``--causal-amax``, for any recipe.) Each is built by ``fp4jax.recipes.compose`` from its published base and differs
from it in that one field only.
"""

from __future__ import annotations

import dataclasses

import fp4jax


def ms_fp4_ste() -> fp4jax.recipes.Recipe:
  """ms_fp4 with the forward W operand's estimator ``"ste"`` (the published recipe's is ``"dge"``)."""
  base = fp4jax.recipes.get("ms_fp4")
  return fp4jax.recipes.compose("ms_fp4_ste", base=base, fwd_rhs=dataclasses.replace(base.fwd_rhs, estimator="ste"))


def quartet_quest_nearest() -> fp4jax.recipes.Recipe:
  """quartet with both forward operands' MXFP4 scale mode ``"quest_nearest"`` (the published recipe's is
  ``"quest"``, rounding log2 of the scale down)."""
  base = fp4jax.recipes.get("quartet")
  nearest = lambda spec: dataclasses.replace(spec, fmt=dataclasses.replace(spec.fmt, scale_mode="quest_nearest"))  # noqa: E731
  return fp4jax.recipes.compose(
    "quartet_quest_nearest", base=base, fwd_lhs=nearest(base.fwd_lhs), fwd_rhs=nearest(base.fwd_rhs)
  )
