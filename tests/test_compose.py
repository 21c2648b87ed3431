"""Composable recipes (``fp4jax.recipes.compose``, ``Recipe.table``, ``register``): the published recipes as
compositions, composed recipes against the NumPy layer oracle, validation naming the part, registration by name."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax import recipes
from fp4jax.formats import E4M3, E5M2, NVFP4
from fp4jax.recipes import HIGH_PRECISION, REUSE_FORWARD, OperandSpec, Recipe
from tests import oracles
from tests.test_oracles_dot import DN, K, M, N, _library

NV46_L1 = dataclasses.replace(NVFP4, scale_mode="four_over_six", four_over_six_metric="l1")
EDEN_BWD = OperandSpec(fmt=NVFP4, rounding="eden", hadamard=128, signs="random")


def _composed():
  """The issue's examples: FP8 forward with NVIDIA's NVFP4 backward, NVIDIA's forward with Quartet II's MS-EDEN
  backward, QuEST-style forward on NVFP4 (Hadamard, trust mask) with SR + RHT backward (TE issue #1701), and
  Quartet II with an L1 four-over-six forward."""
  sr_rht = OperandSpec(fmt=NVFP4, rounding="sr", hadamard=16, signs="random")
  rht_fwd = OperandSpec(fmt=NVFP4, hadamard=16, signs="random", source="forward")
  return {
    "e4m3_fwd_nvfp4_bwd": recipes.compose(
      "e4m3_fwd_nvfp4_bwd", base="nvidia_nvfp4", fwd=OperandSpec(fmt=E4M3), dgrad_rhs=OperandSpec(fmt=NVFP4)
    ),
    "nvidia_eden": recipes.compose("nvidia_eden", base="nvidia_nvfp4", dgrad="quartet2", wgrad="quartet2"),
    "quest_nvfp4_sr_rht": recipes.compose(
      "quest_nvfp4_sr_rht",
      fwd=OperandSpec(fmt=NVFP4, hadamard=16, estimator="trust_mask"),
      dgrad=(sr_rht, rht_fwd),
      wgrad=(sr_rht, rht_fwd),
    ),
    "quartet2_l1": recipes.compose("quartet2_l1", base="quartet2", fwd=OperandSpec(fmt=NV46_L1)),
  }


# ------------------------------------------------------------------------------------------------ building
def test_published_recipes_are_the_documented_operand_lists():
  """Three published recipes against their operand lists written out from their docstrings (Recipe's positional
  order: fwd_lhs, fwd_rhs, dgrad_lhs, dgrad_rhs, wgrad_lhs, wgrad_rhs)."""
  e4m3, e5m2 = OperandSpec(fmt=E4M3), OperandSpec(fmt=E5M2)
  assert recipes.fp8() == Recipe("fp8", e4m3, e4m3, e5m2, REUSE_FORWARD, e5m2, REUSE_FORWARD)
  nv = OperandSpec(fmt=NVFP4)
  nv_w = OperandSpec(fmt=NVFP4, block_shape=(16, 16))
  dy = OperandSpec(fmt=NVFP4, rounding="sr")
  dy_t = OperandSpec(fmt=NVFP4, rounding="sr", hadamard=16, signs="te")
  x_t = OperandSpec(fmt=NVFP4, hadamard=16, signs="te")
  assert recipes.nvidia_nvfp4() == Recipe("nvidia_nvfp4", nv, nv_w, dy, REUSE_FORWARD, dy_t, x_t)
  q46 = OperandSpec(fmt=dataclasses.replace(NVFP4, scale_mode="four_over_six"))
  from_fwd = dataclasses.replace(EDEN_BWD, source="forward")
  assert recipes.quartet2() == Recipe("quartet2", q46, q46, EDEN_BWD, from_fwd, EDEN_BWD, from_fwd)
  assert recipes.bf16() == Recipe("bf16") == recipes.compose("bf16")


def test_compose_applies_base_then_gemms_then_operands():
  nv = OperandSpec(fmt=NVFP4)
  r = recipes.compose("r", base="fp8", dgrad=nv, wgrad_rhs=HIGH_PRECISION)
  fp8 = recipes.fp8()
  assert (r.name, r.fwd_lhs, r.fwd_rhs) == ("r", fp8.fwd_lhs, fp8.fwd_rhs)  # from the base
  assert r.dgrad_lhs == r.dgrad_rhs == nv  # one spec: both operands
  assert (r.wgrad_lhs, r.wgrad_rhs) == (fp8.wgrad_lhs, HIGH_PRECISION)  # a single operand over the base's GEMM
  pair = recipes.compose("p", fwd=(OperandSpec(fmt=E4M3), nv))
  assert (pair.fwd_lhs.fmt, pair.fwd_rhs.fmt, pair.dgrad_lhs) == (E4M3, NVFP4, HIGH_PRECISION)
  nvidia = recipes.nvidia_nvfp4()
  assert recipes.compose("w", wgrad=nvidia).operands("wgrad") == nvidia.operands("wgrad")  # a recipe as a part
  assert recipes.compose("q", fwd=fp4jax.QuantizeSpec(NVFP4)).fwd_lhs == nv  # a QuantizeSpec becomes an OperandSpec


@pytest.mark.parametrize(
  ("kwargs", "error", "match"),
  [
    (  # MS-EDEN's 128-point rotation on dY but not on the reused W
      dict(base="nvidia_nvfp4", dgrad_lhs=EDEN_BWD),
      ValueError,
      r"recipe 'bad': both dgrad operands must share the Hadamard size and signs",
    ),
    (dict(wgrad_lhs=OperandSpec(fmt=NVFP4, estimator="trust_mask")), ValueError, r"'bad': wgrad_lhs is a backward"),
    (dict(fwd=OperandSpec(fmt=NVFP4, estimator="trust_mask")), ValueError, r"fwd_lhs trust_mask .*dgrad_rhs\.source"),
    (dict(fwd_lhs=REUSE_FORWARD), ValueError, r"fwd_lhs\.source must be 'input'"),
    (dict(fwd_x=OperandSpec(fmt=NVFP4)), TypeError, r"unknown operand keyword\(s\) \['fwd_x'\]"),
    (dict(dgrad="nvfp4"), ValueError, r"unknown recipe 'nvfp4'"),
    (dict(dgrad=NVFP4), TypeError, r"compose\('bad'\)=dgrad \(an OperandSpec for both operands"),
    (dict(dgrad=(HIGH_PRECISION,) * 3), TypeError, r"=dgrad: a tuple must be an \(lhs, rhs\) pair"),
    (dict(wgrad=(HIGH_PRECISION, 1)), TypeError, r"=wgrad\[1\] \(wgrad_rhs\) must be an fp4jax\.recipes\.OperandSpec"),
    (dict(base="nope"), ValueError, r"unknown recipe 'nope'"),
  ],
)
def test_invalid_compositions_name_the_part(kwargs, error, match):
  with pytest.raises(error, match=match):
    recipes.compose("bad", **kwargs)


def test_compose_needs_a_name():
  with pytest.raises(ValueError, match="name must be a non-empty string"):
    recipes.compose("", fwd=OperandSpec(fmt=NVFP4))


# ------------------------------------------------------------------------------------------------ the table
def test_table_of_nvidia_nvfp4():
  """Row by row as the recipe's docstring states it (columns: GEMM, operand, format, block, rounding,
  hadamard size/signs, estimator, source, other)."""
  lines = recipes.nvidia_nvfp4().table().splitlines()
  assert lines[0] == "recipe 'nvidia_nvfp4'"
  assert lines[1].split() == [
    "GEMM",
    "operand",
    "format",
    "block",
    "rounding",
    "hadamard",
    "estimator",
    "source",
    "other",
  ]
  assert set(lines[2]) == {"-"}
  assert [row.split() for row in lines[3:]] == [
    ["fwd", "X", "nvfp4", "1x16", "rtn", "-", "ste", "input", "-"],
    ["fwd", "W", "nvfp4", "16x16", "rtn", "-", "ste", "input", "-"],
    ["dgrad", "dY", "nvfp4", "1x16", "sr", "-", "ste", "input", "-"],
    ["dgrad", "Wᵀ", "as", "forward", "-", "-", "-", "ste", "forward", "-"],
    ["wgrad", "dYᵀ", "nvfp4", "1x16", "sr", "16/te", "ste", "input", "-"],
    ["wgrad", "Xᵀ", "nvfp4", "1x16", "rtn", "16/te", "ste", "input", "-"],
  ]


def test_table_shows_format_options_and_operand_options():
  rows = {r.split()[1]: r for r in _composed()["quartet2_l1"].table().splitlines()[3:]}
  assert "nvfp4 (four_over_six, l1)" in rows["X"] and "128/random" in rows["dY"] and "eden" in rows["dY"]
  ms = {r.split()[1]: r for r in recipes.ms_fp4().table().splitlines()[3:]}
  assert (
    "occ q=0.99" in ms["X"] and "dge(k=5.0, cap=3.0)" in ms["W"] and ms["dY"].split()[2:4] == ["fp8_e5m2", "tensor"]
  )
  causal = {r.split()[1]: r for r in recipes.causal("nvfp4_rtn").table().splitlines()[3:]}
  assert causal["X"].endswith("amax=row") and causal["W"].endswith("-")
  blocks = {r.split()[1]: r.split()[2:4] for r in recipes.fp8_block().table().splitlines()[3:]}
  assert blocks["X"] == ["fp8_e4m3_block", "1x128"] and blocks["W"] == ["fp8_e4m3_block", "128x128"]
  mx = recipes.mxfp8().table().splitlines()[3].split()
  assert mx[2:5] == ["mxfp8_e4m3", "(rceil)", "1x32"]


# ------------------------------------------------------------------------------------------------ running
@pytest.mark.parametrize(  # slow tier; default representative: [e4m3_fwd_nvfp4_bwd] (forward, dgrad, wgrad parts)
  "name", ["e4m3_fwd_nvfp4_bwd", pytest.param("quartet2_l1", marks=pytest.mark.slow)]
)
def test_composed_recipes_equal_the_numpy_layer_oracle(name):
  """The deterministic variant of each composition (RTN, the run's fixed signs) against ``oracles.layer_grads``,
  which reads the operand specs as data: forward, dX and dW (see tests/test_oracles_dot.py)."""
  recipe = recipes.deterministic(_composed()[name])
  x, w, dy = oracles.dyadic(1, (M, K), 6.0), oracles.dyadic(2, (N, K), -6.0), oracles.dyadic(3, (M, N), 6.0)
  d_bwd = recipe.dgrad_lhs.hadamard
  bwd_signs = oracles.fixed_signs(d_bwd) if d_bwd and recipe.dgrad_lhs.signs == "fixed" else None
  want = oracles.layer_grads(recipe, x, w, dy, None, bwd_signs)
  for got, t, what in zip(_library(recipe, x, w, dy), want, ("y", "dx", "dw")):
    oracles.assert_close(got, t, f"{name}: {what}")


# slow tier; default representative: test_compose_applies_base_then_gemms_then_operands (the parts replace the
# base's) and test_composed_recipes_equal_the_numpy_layer_oracle[e4m3_fwd_nvfp4_bwd] (the dot runs those parts)
@pytest.mark.slow
def test_a_composed_recipe_differs_from_its_base():
  """Power check: the compositions change the numbers (FP8 forward vs NVIDIA's NVFP4 forward)."""
  x, w, dy = oracles.dyadic(1, (M, K), 6.0), oracles.dyadic(2, (N, K), -6.0), oracles.dyadic(3, (M, N), 6.0)
  base = _library(recipes.deterministic("nvidia_nvfp4"), x, w, dy)
  composed = _library(recipes.deterministic(_composed()["e4m3_fwd_nvfp4_bwd"]), x, w, dy)
  assert np.max(np.abs(base[0] - composed[0])) > 1e-3 * np.max(np.abs(base[0]))


@pytest.mark.parametrize(  # slow tier; default representative: [quest_nvfp4_sr_rht] (SR and random RHT backward)
  "name", ["quest_nvfp4_sr_rht", pytest.param("nvidia_eden", marks=pytest.mark.slow)]
)
def test_random_composed_recipes_run_under_jit_and_grad(name):
  """QuEST-style NVFP4 forward (trust mask) with SR + RHT backward, and NVIDIA's forward with MS-EDEN gradients
  (whose W rotated after the 16x16 forward quantization does not rotate exactly in float32, which the layer oracle
  needs): finite forward and gradients, the key changes the (stochastic) backward only."""
  recipe = _composed()[name]
  x, w, dy = oracles.dyadic(1, (M, K), 6.0), oracles.dyadic(2, (N, K), -6.0), oracles.dyadic(3, (M, N), 6.0)

  @jax.jit
  def run(key):
    y, vjp = jax.vjp(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=recipe, key=key), x, w)
    return (y, *vjp(jnp.asarray(dy)))

  a, b = run(jax.random.key(0)), run(jax.random.key(1))
  assert all(bool(jnp.all(jnp.isfinite(t))) for t in (*a, *b))
  np.testing.assert_array_equal(a[0], b[0])
  assert not np.array_equal(a[1], b[1]) and not np.array_equal(a[2], b[2])


# ------------------------------------------------------------------------------------------------ registering
@pytest.fixture
def registered():
  recipe = recipes.register(_composed()["e4m3_fwd_nvfp4_bwd"])
  yield recipe
  recipes.unregister(recipe.name)
  assert recipes.names() == recipes.PUBLISHED


def test_registered_name_works_wherever_a_recipe_name_does(registered):
  assert recipes.names() == (*recipes.PUBLISHED, registered.name)
  assert recipes.get(registered.name) is registered
  x, w = jnp.asarray(oracles.dyadic(1, (M, K), 6.0)), jnp.asarray(oracles.dyadic(2, (N, K), -6.0))
  key = jax.random.key(0)
  by_name = fp4jax.dot_general(x, w, DN, recipe=registered.name, key=key)
  np.testing.assert_array_equal(by_name, fp4jax.dot_general(x, w, DN, recipe=registered, key=key))
  from fp4jax.flax import linen as fp4_linen

  dense = fp4_linen.Dense(8, recipe=registered.name)  # traced abstractly: the layer resolves the name when traced
  params = jax.eval_shape(dense.init, jax.random.key(0), jnp.ones((4, 16)))
  assert jax.eval_shape(lambda p: dense.apply(p, jnp.ones((4, 16)), rngs={"quant": key}), params).shape == (4, 8)


def test_register_refuses_published_names_and_duplicates(registered):
  with pytest.raises(ValueError, match="'quartet2' is a published recipe"):
    recipes.register(dataclasses.replace(registered, name="quartet2"))
  with pytest.raises(ValueError, match="already registered; pass replace=True"):
    recipes.register(registered)
  assert recipes.register(registered, replace=True) is registered
  with pytest.raises(TypeError, match="must be an fp4jax.recipes.Recipe"):
    recipes.register("e4m3_fwd_nvfp4_bwd")
  with pytest.raises(ValueError, match="'nvidia_nvfp4' is not a registered recipe of one's own"):
    recipes.unregister("nvidia_nvfp4")
