"""fp4jax_experiments.ablations: each controlled-experiment recipe is its published base with one choice changed,
and loads by ``module:attr`` as the sweep names it."""

import dataclasses

import pytest

from fp4jax import recipes
from fp4jax_experiments import ablations
from fp4jax_experiments import model as model_lib


@pytest.mark.parametrize(
  ("attr", "base", "changed"),
  [
    ("ms_fp4_ste", "ms_fp4", {"fwd_rhs": {"estimator": ("dge", "ste")}}),
    (
      "quartet_quest_nearest",
      "quartet",
      {"fwd_lhs": {"scale_mode": ("quest", "quest_nearest")}, "fwd_rhs": {"scale_mode": ("quest", "quest_nearest")}},
    ),
  ],
)
def test_an_ablation_changes_one_choice_of_its_base(attr, base, changed):
  recipe, published = getattr(ablations, attr)(), recipes.get(base)
  assert recipe.name == attr
  for operand in recipes.OPERANDS:
    got, want = getattr(recipe, operand), getattr(published, operand)
    for field, (before, after) in changed.get(operand, {}).items():
      where = got.fmt if field == "scale_mode" else got
      assert (getattr(want.fmt if field == "scale_mode" else want, field), getattr(where, field)) == (before, after)
      if field == "scale_mode":
        got = dataclasses.replace(got, fmt=dataclasses.replace(got.fmt, scale_mode=before))
      else:
        got = dataclasses.replace(got, **{field: before})
    assert got == want, operand  # nothing else differs


def test_ablations_load_as_module_attr_recipes(published_recipes_only):
  for attr in ("ms_fp4_ste", "quartet_quest_nearest"):
    name = model_lib.resolve_recipe(f"fp4jax_experiments.ablations:{attr}")
    assert recipes.get(name) == dataclasses.replace(getattr(ablations, attr)(), name=name)  # registered as named
