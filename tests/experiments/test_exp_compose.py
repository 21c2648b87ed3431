"""The trainer under a composed recipe (``fp4jax.recipes.compose``) named ``module:attr`` (``model.resolve_recipe``)."""

import json

import numpy as np
import pytest

from fp4jax import recipes
from fp4jax_experiments import model as model_lib
from fp4jax_experiments import train

TINY = {"n_layers": 1, "d_model": 64, "n_heads": 2, "ffn_hidden": 64}
RECIPE_MODULE = """
from fp4jax.formats import E4M3, NVFP4
from fp4jax.recipes import OperandSpec, compose

E4M3_FWD_NVFP4_BWD = compose(
  "e4m3_fwd_nvfp4_bwd", base="nvidia_nvfp4", fwd=OperandSpec(fmt=E4M3), dgrad_rhs=OperandSpec(fmt=NVFP4)
)
NOT_A_RECIPE = 3
"""


@pytest.fixture
def recipe_module(tmp_path, monkeypatch, published_recipes_only):
  (tmp_path / "my_fp4_recipes.py").write_text(RECIPE_MODULE)
  monkeypatch.syspath_prepend(str(tmp_path))
  return "my_fp4_recipes"


# slow tier; default representative: an FP4 training run; its parts: test_a_recipe_that_does_not_load_names_why (the
# module:attr loader) and tests/test_compose.py::test_random_composed_recipes_run_under_jit_and_grad
@pytest.mark.slow
def test_trains_a_composed_recipe_named_module_attr(corpus, tmp_path, recipe_module):
  name = f"{recipe_module}:E4M3_FWD_NVFP4_BWD"
  config = train.TrainConfig(
    model="100K", recipe=name, tokens=6 * 8 * 64, data=corpus, batch_size=8, seq_len=64, log_every=1, eval_every=6,
    eval_batches=1, ckpt_every=6, lr=3e-3,
  )  # fmt: skip
  summary = train.train(config, tmp_path / "run", quiet=True, model_overrides=TINY)
  assert summary["status"] == "finished"
  registered = recipes.get(name)
  assert registered.fwd_lhs.fmt.name == "fp8_e4m3" and registered.dgrad_lhs.rounding == "sr"  # the module's recipe
  assert json.loads((tmp_path / "run" / "config.json").read_text())["recipe"] == name  # a resume loads it again
  losses = [r["loss"] for r in train.read_metrics(tmp_path / "run", "train")]
  assert len(losses) == 6 and np.all(np.isfinite(losses)) and np.mean(losses[-2:]) < np.mean(losses[:2])


@pytest.mark.parametrize(
  ("recipe", "match"),
  [
    ("nvfp4", r"unknown recipe 'nvfp4': expected one of \('bf16'"),
    ("no_such_module_xyz:R", r"cannot load 'R' from module 'no_such_module_xyz'"),
    ("my_fp4_recipes:MISSING", r"cannot load 'MISSING' from module 'my_fp4_recipes'"),
    ("my_fp4_recipes:NOT_A_RECIPE", r"my_fp4_recipes\.NOT_A_RECIPE is not an fp4jax\.recipes\.Recipe"),
  ],
)
def test_a_recipe_that_does_not_load_names_why(recipe, match, recipe_module):
  with pytest.raises(ValueError, match=match):
    model_lib.projection_dot_cls(recipe)
