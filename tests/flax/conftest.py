"""Shared setup of the Flax integration tests.

TEMPORARY: ``fp4jax.recipes.deterministic`` (the evaluation variant of a recipe, owned by the recipes module) is
not there yet; until it lands, this stand-in with the agreed contract (stochastic roundings -> RTN, fresh random
Hadamard signs -> fixed ones) is installed. It is used ONLY when the real function is missing.
"""

import dataclasses

from fp4jax import recipes

if not hasattr(recipes, "deterministic"):

  def _fixed(spec):
    return dataclasses.replace(spec, rounding="rtn", signs="fixed" if spec.signs == "random" else spec.signs)

  def deterministic(recipe):
    recipe = recipes.get(recipe)
    return dataclasses.replace(recipe, **{f: _fixed(getattr(recipe, f)) for f in
                                          ("fwd_lhs", "fwd_rhs", "dgrad_lhs", "dgrad_rhs", "wgrad_lhs", "wgrad_rhs")})

  recipes.deterministic = deterministic
