"""Strict causality of the FP4 language model: per-token amax (``--causal-amax``) vs the per-tensor default."""

import argparse
import dataclasses
import json

import jax
import numpy as np
import pytest

from fp4jax._src import recipes
from fp4jax_experiments import model as m
from fp4jax_experiments import train

VOCAB, SEQ, POS = 64, 32, 11  # tokens after position POS of row 0 change


def _tokens(params):
  """Two batches that differ in row 0 after POS; only the second holds the token whose normalized embedding has
  the largest max|x| (the first block's input at init, RMSNorm gains 1), so the first projections' per-tensor
  amax differs between them."""
  table = np.asarray(params["embed"]["embedding"], np.float32)
  normed = table / np.sqrt(np.mean(table**2, axis=-1, keepdims=True))
  top = int(np.argmax(np.max(np.abs(normed), axis=-1)))
  tokens = np.asarray(jax.random.randint(jax.random.key(1), (2, SEQ), 0, VOCAB - 1))
  tokens = np.where(tokens >= top, tokens + 1, tokens)  # every token but `top`
  changed = tokens.copy()
  changed[0, POS + 1 :] = (tokens[0, POS + 1 :] * 7 + 3) % VOCAB
  changed[0, POS + 1] = top
  return tokens, changed


def _logits(recipe: str, causal_amax: bool):
  config = m.model_config("100K", vocab_size=VOCAB, recipe=recipe, causal_amax=causal_amax)
  params = m.init_params(config, jax.random.key(0))
  forward = jax.jit(lambda tokens: m.Llama(config).apply({"params": params}, tokens, rngs={"quant": jax.random.key(2)}))
  return [np.asarray(forward(t)) for t in _tokens(params)]


# One mechanism for every recipe (fp4jax.recipes.causal): the default tier runs fp8 (the cheapest model compile, about
# a fifth of an FP4 one on the CPU); every FP4 recipe runs in the slow tier (docs/testing.md).
def _slow_but_fp8(recipes):
  # slow tier; default representative: the [fp8] case (the same causal(recipe) wrapper and checks)
  return [r if r == "fp8" else pytest.param(r, marks=pytest.mark.slow) for r in recipes]


@pytest.mark.parametrize("recipe", _slow_but_fp8(["nvidia_nvfp4", "quartet2", "nvfp4_rtn", "fp8", "ms_fp4"]))
def test_causal_amax_makes_the_fp4_model_strictly_causal(recipe):
  """With causal(recipe), changing row 0's tokens after POS leaves row 0's logits at positions <= POS and all of
  row 1's logits bit-identical; the later positions of row 0 do change (the change is seen)."""
  before, after = _logits(recipe, causal_amax=True)
  np.testing.assert_array_equal(before[0, : POS + 1], after[0, : POS + 1])
  np.testing.assert_array_equal(before[1], after[1])
  assert not np.allclose(before[0, POS + 1 :], after[0, POS + 1 :])


@pytest.mark.parametrize("recipe", _slow_but_fp8(["nvidia_nvfp4", "quartet2", "nvfp4_rtn", "fp8"]))
def test_per_tensor_amax_is_not_strictly_causal(recipe):
  """The default (Transformer Engine's per-tensor amax): later tokens of row 0 move earlier logits and row 1's."""
  before, after = _logits(recipe, causal_amax=False)
  assert not np.array_equal(before[0, : POS + 1], after[0, : POS + 1])
  assert not np.array_equal(before[1], after[1])


def test_causal_amax_flag_reaches_the_model_and_config_json(tmp_path):
  parser = argparse.ArgumentParser()
  train.add_config_arguments(parser)
  config = train.config_from_args(parser.parse_args(["--recipe", "quartet2", "--causal-amax"]))
  assert config.causal_amax and not train.config_from_args(parser.parse_args([])).causal_amax
  assert train.config_from_args(parser.parse_args(train.config_to_args(config))) == config
  assert "--causal-amax" not in train.config_to_args(dataclasses.replace(config, causal_amax=False))
  train.RunFolder(tmp_path / "run", config)
  assert json.loads((tmp_path / "run" / "config.json").read_text())["causal_amax"] is True
  dot = m.projection_dot_cls("quartet2", causal=True)
  assert dot.keywords["recipe"] == recipes.causal("quartet2")
  assert m.projection_dot_cls("quartet2").keywords["recipe"] == "quartet2"
