"""Every recipe's ``fp4jax.dot_general`` forward and gradients against the NumPy layer oracle (tests/oracles.py).

The deterministic variant of each recipe (``recipes.deterministic``: RTN instead of SR / MS-EDEN, the run's fixed
Hadamard signs) makes the backward exactly computable: the oracle quantizes each GEMM's operands as the recipe says,
applies the trust mask before the inverse rotation and DGE at the scaled weights, and multiplies in float64.
Inputs are dyadic (k/8, |x| <= 4, one entry ±6 so NVFP4's tensor scales are powers of two): every Hadamard sum is
exact in float32, so the oracle makes the same rounding decisions and the results agree to accumulation error.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax._src import recipes
from tests import oracles

DN = (((1,), (1,)), ((), ()))
M, K, N = 128, 64, 128  # Quartet II's backward Hadamard-128 runs along tokens (M) and outputs (N)


def _library(recipe, x, w, dy):
  def run(x, w, dy):
    y, vjp = jax.vjp(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=recipe), x, w)
    return (y, *vjp(dy))

  return [np.asarray(t, np.float64) for t in jax.jit(run)(x, w, dy)]


RECIPES = {name: recipes.deterministic(name) for name in recipes.names() if name != "bf16"}
RECIPES["ms_fp4_q90"] = recipes.ms_fp4(clip_quantile=0.9)  # OCC that clamps 6 of 64 per row at each end
RECIPES["ms_fp4_fp4_grads"] = recipes.ms_fp4(fp4_gradients=True)


@pytest.mark.parametrize(  # slow tier; default representative: [ms_fp4] (the same OCC and DGE; q=0.99, FP8 gradients)
  "name", [pytest.param(n, marks=pytest.mark.slow) if n.startswith("ms_fp4_") else n for n in sorted(RECIPES)]
)
def test_forward_and_gradients_equal_the_numpy_oracle(name):
  recipe = RECIPES[name]
  assert not recipe.is_random
  x, w, dy = oracles.dyadic(1, (M, K), 6.0), oracles.dyadic(2, (N, K), -6.0), oracles.dyadic(3, (M, N), 6.0)
  d_fwd, d_bwd = recipe.fwd_lhs.hadamard, recipe.dgrad_lhs.hadamard
  fwd_signs = oracles.fixed_signs(d_fwd) if d_fwd and recipe.fwd_lhs.signs == "fixed" else None
  bwd_signs = oracles.fixed_signs(d_bwd) if d_bwd and recipe.dgrad_lhs.signs == "fixed" else None
  want = oracles.layer_grads(recipe, x, w, dy, fwd_signs, bwd_signs)
  got = _library(recipe, x, w, dy)
  for g, t, what in zip(got, want, ("y", "dx", "dw")):
    oracles.assert_close(g, t, f"{name}: {what}")


def test_quartet_trust_mask_drops_gradient_and_the_estimators_matter():
  """Power check of the oracle test: on these inputs Quartet's trust mask zeroes some gradient entries and the
  mask-after-rotation order gives a different dX; DGE at the unscaled weights a different dW."""
  x, w = oracles.dyadic(1, (M, K), 6.0), oracles.dyadic(2, (N, K), -6.0)
  mask = oracles.quantize(x, recipes.quartet().fwd_lhs).mask
  assert 0 < np.sum(~mask) < mask.size
  w32 = w.astype(np.float32)
  scaled, unscaled = oracles.dge_derivative(w32 * oracles.channel_gamma(w32)), oracles.dge_derivative(w32)
  assert np.linalg.norm(scaled - unscaled) > 0.1 * np.linalg.norm(scaled)


def test_dge_derivative_matches_the_paper():
  """MS-AMP's reference value f'(±6) = 1/k = 0.2, the cap at interval midpoints, and interior points by hand."""
  from fp4jax._src import estimators

  pts = np.array([6.0, -6.0, 0.25, 2.5, 5.0, 0.0, 1.0, 0.3, -3.2, 4.5, 7.0, 1.9], np.float32)
  hand = {0.3: 0.2 * 0.2**-0.8, -3.2: 0.2 * 0.6**-0.8, 4.5: 0.2 * 0.5**-0.8, 1.9: 0.2 * 0.6**-0.8}
  want = oracles.dge_derivative(pts)
  np.testing.assert_allclose(want[:5], [0.2, 0.2, 3.0, 3.0, 3.0])
  for p, v in hand.items():
    np.testing.assert_allclose(want[list(pts).index(np.float32(p))], v, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(estimators.dge_derivative(jnp.asarray(pts))), want, rtol=2e-6)


def test_deterministic_variant_only_removes_randomness():
  """The oracle test relies on ``recipes.deterministic`` keeping everything but SR/EDEN and fresh signs."""
  for name in recipes.names():
    rec, det = recipes.get(name), recipes.deterministic(name)
    for a, b in zip(rec.specs, det.specs):
      assert dataclasses.replace(a, rounding="rtn", signs="fixed" if a.signs == "random" else a.signs) == b
