"""A small transformer (attention + SwiGLU) trains under every recipe, in linen and in NNX, quantized by rules.

Each run: 4 Adam steps (lr 1e-2) on one fixed batch of 128 tokens, fp32 master weights, bf16 compute. The loss
starts at ~ln(64) = 4.16; memorizing one batch lowers it by far more than the 0.1 asserted, for every recipe
(quantization noise in the loss is ~1e-3 at this size).

Whole training runs (a train-step compile each, 9 to 70 s on a CPU): the slow tier's (`pytest -m slow`), except
one FP4 run by default: NNX under quartet (QuEST's trust mask, the random Hadamard, the "quant" stream).
"""

import flax_models as fm
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from fp4jax._src import recipes
from fp4jax.flax import Rule, quantize, summary

STEPS, LR, MIN_DROP = 4, 1e-2, 0.1

# slow tier; default representative: test_nnx_transformer_trains_under_recipe[quartet] (an FP4 step end to end) and
# the parts of a step, in tests/flax/test_flax_layers.py (each layer is fp4jax.dot_general with the recipe's error;
# FP4 gradients with the "quant" stream per layer and per step, under jax.jit and nnx.jit),
# tests/flax/test_flax_rules.py (the rules' layer plan, linen and NNX) and tests/flax/test_moe.py
SLOW = pytest.mark.slow


def _train_linen(model, toks, steps=STEPS):
  # Quantizing keeps the parameter tree: initialize through the plain module (no quantized forward to compile).
  params = jax.jit(model.module.init)(jax.random.key(1), toks[:, :-1])["params"]
  opt = optax.adam(LR)

  @jax.jit
  def step(params, opt_state, key):
    def loss_fn(p):
      logits = model.apply({"params": p}, toks[:, :-1], rngs={"quant": key})
      assert logits.dtype == jnp.bfloat16  # compute dtype, traced once
      return fm.loss_from_logits(logits, toks)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state, losses = opt.init(params), []
  for i in range(steps):
    params, opt_state, loss = step(params, opt_state, jax.random.key(100 + i))
    losses.append(float(loss))
  return params, losses


@SLOW
@pytest.mark.parametrize("recipe", recipes.names())
def test_linen_transformer_trains_under_recipe(recipe):
  toks = fm.tokens(jax.random.key(0))
  params, losses = _train_linen(quantize(fm.LinenTransformer(fm.Config()), [Rule(".*", recipe)]), toks)
  assert all(jnp.isfinite(jnp.asarray(losses))), losses
  assert losses[-1] < losses[0] - MIN_DROP, losses
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))  # fp32 master weights


@SLOW
def test_linen_scan_remat_transformer_trains():
  """nn.scan over nn.remat blocks: one layer path ("blocks/block/down") carries the recipe to every block; the
  "quant" stream is split across the scanned blocks (one quantized projection keeps the compile short)."""
  model = quantize(fm.LinenScanTransformer(fm.Config(n_layers=2)), [Rule(r"blocks/block/down", "nvidia_nvfp4")])
  toks = fm.tokens(jax.random.key(0))
  s = summary(model, toks[:, :-1], show=False)
  assert s.recipes() == {
    "blocks/block/qkv": "high precision",
    "blocks/block/o": "high precision",
    "blocks/block/gate_up": "high precision",
    "blocks/block/down": "nvidia_nvfp4",
    "lm_head": "high precision",
  }
  _, losses = _train_linen(model, toks)
  assert losses[-1] < losses[0] - MIN_DROP, losses


@pytest.mark.parametrize("recipe", [pytest.param(r, marks=() if r == "quartet" else SLOW) for r in recipes.names()])
def test_nnx_transformer_trains_under_recipe(recipe):
  """The attention output and MLP down projections run the recipe (half of the linen test's quantized GEMMs: the
  NNX mechanics under test, the stream through nnx.jit and nnx.value_and_grad, are per layer, the compile is not)."""
  toks = fm.tokens(jax.random.key(0))
  model = fm.NnxTransformer(fm.Config(), nnx.Rngs(params=1))
  quantize(model, [Rule(r".*/(o|down)", recipe)], rngs=nnx.Rngs(quant=2))
  optimizer = nnx.Optimizer(model, optax.adam(LR), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer):
    loss, grads = nnx.value_and_grad(lambda m: fm.loss_from_logits(m(toks[:, :-1]), toks))(model)
    optimizer.update(model, grads)
    return loss

  losses = [float(step(model, optimizer)) for _ in range(STEPS)]
  assert all(jnp.isfinite(jnp.asarray(losses))), losses
  assert losses[-1] < losses[0] - MIN_DROP, losses
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
