"""The linen and NNX ``MoE`` layers against a per-token NumPy loop (routing, experts, combine) and, under an FP4
recipe, against ``fp4jax.ragged_dot`` on tokens the test sorts itself."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fp4jax
import fp4jax.flax as fq
from fp4jax.flax import linen as qlinen
from fp4jax.flax import nnx as qnnx

D, E, TOP_K, HIDDEN = 16, 4, 2, 8


def _x(seed=0, shape=(2, 5, D)):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _route(tokens, router):
  """NumPy routing: float64 softmax, the top-k experts (ties: lower index first), weights renormalized."""
  logits = tokens.astype(np.float64) @ router.astype(np.float64)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  experts = np.argsort(-probs, axis=-1, kind="stable")[:, :TOP_K]
  weights = np.take_along_axis(probs, experts, -1)
  return weights / weights.sum(-1, keepdims=True), experts


def _silu(v):
  return v / (1.0 + np.exp(-v))


def _numpy_moe(x, router, w_in, w_out):
  tokens = np.asarray(x, np.float64).reshape(-1, D)
  weights, experts = _route(tokens, np.asarray(router))
  w_in, w_out = np.asarray(w_in, np.float64), np.asarray(w_out, np.float64)
  y = np.zeros_like(tokens)
  for t in range(len(tokens)):
    for j in range(TOP_K):
      h = tokens[t] @ w_in[experts[t, j]]
      y[t] += weights[t, j] * ((_silu(h[:HIDDEN]) * h[HIDDEN:]) @ w_out[experts[t, j]])
  return y.reshape(x.shape)


def _linen(recipe, **kw):
  model = qlinen.MoE(E, TOP_K, HIDDEN, recipe=recipe, **kw)
  return model, model.init(jax.random.key(0), _x())["params"]


@pytest.fixture(autouse=True)
def _float32_matmuls():
  """A GPU runs float32 matmuls as TF32 by default; these tests compare float32 models with float64 NumPy."""
  with jax.default_matmul_precision("highest"):
    yield


def test_linen_moe_equals_a_per_token_numpy_loop():
  model, params = _linen("bf16")
  x = _x(1)
  got = model.apply({"params": params}, x)
  want = _numpy_moe(x, params["router"]["kernel"], params["w_in"], params["w_out"])
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_nnx_moe_equals_the_numpy_loop_and_has_linens_parameters():
  layer = qnnx.MoE(D, HIDDEN, E, TOP_K, recipe="bf16", rngs=nnx.Rngs(0))
  x = _x(2)
  want = _numpy_moe(x, layer.router.kernel[...], layer.w_in[...], layer.w_out[...])
  np.testing.assert_allclose(np.asarray(layer(x)), want, rtol=1e-5, atol=1e-6)
  _, params = _linen("bf16")
  assert jax.tree.map(jnp.shape, {"w_in": layer.w_in[...], "w_out": layer.w_out[...]}) == jax.tree.map(
    jnp.shape, {"w_in": params["w_in"], "w_out": params["w_out"]}
  )


def test_fp4_moe_runs_the_experts_through_ragged_dot_on_the_sorted_tokens():
  """nvfp4_rtn: the layer equals routing + a stable sort by expert done here in NumPy, fp4jax.ragged_dot on the
  sorted tokens, and the weighted sum back per token."""
  model, params = _linen("nvfp4_rtn")
  x = _x(3)
  got = np.asarray(model.apply({"params": params}, x)).reshape(-1, D)
  tokens = np.asarray(x).reshape(-1, D)
  weights, experts = _route(tokens, np.asarray(params["router"]["kernel"]))
  flat = experts.reshape(-1)
  order = np.argsort(flat, kind="stable")
  sizes = jnp.asarray(np.bincount(flat, minlength=E), jnp.int32)
  h = np.asarray(fp4jax.ragged_dot(jnp.asarray(tokens[order // TOP_K]), params["w_in"], sizes, recipe="nvfp4_rtn"))
  h = _silu(h[:, :HIDDEN]) * h[:, HIDDEN:]
  ys = np.asarray(fp4jax.ragged_dot(jnp.asarray(h, jnp.float32), params["w_out"], sizes, recipe="nvfp4_rtn"))
  want = np.zeros_like(tokens, np.float64)
  for row, idx in enumerate(order):
    want[idx // TOP_K] += weights[idx // TOP_K, idx % TOP_K] * ys[row]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


# slow tier; default representative: test_fp4_moe_runs_the_experts_through_ragged_dot_on_the_sorted_tokens (the FP4
# experts), tests/test_ragged.py (fp4jax.ragged_dot's gradients) and tests/flax/test_flax_layers.py's stream tests
@pytest.mark.slow
def test_linen_and_nnx_train_under_a_random_recipe():
  """nvidia_nvfp4 (SR, a key per grouped GEMM): gradients reach the router and both expert weights; NNX's stream
  advances, so two steps draw different bits."""
  model, params = _linen("nvidia_nvfp4")
  x = _x(4)
  loss = lambda p, k: jnp.sum(model.apply({"params": p}, x, rngs={"quant": k}) ** 2)
  grads = jax.jit(jax.grad(loss))(params, jax.random.key(1))
  for g in jax.tree.leaves(grads):
    assert np.all(np.isfinite(g)) and np.any(g != 0)
  layer = qnnx.MoE(D, HIDDEN, E, TOP_K, recipe="nvidia_nvfp4", rngs=nnx.Rngs(params=0, quant=1))
  step = nnx.jit(nnx.grad(lambda m: jnp.sum(m(x) ** 2)))
  g1, g2 = step(layer), step(layer)
  assert np.any(g1.w_in[...] != 0) and not np.array_equal(g1.w_in[...], g2.w_in[...])


class _Net(nn.Module):
  """A dense projection feeding a bf16 MoE layer."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(D, use_bias=False, name="proj")(x)
    return h, qlinen.MoE(E, TOP_K, HIDDEN, recipe="bf16", name="moe")(h)


def test_rules_plan_the_dense_layers_and_never_the_router():
  """The tracing half of the slow test below: a catch-all rule plans ``proj`` alone (linen), and NNX's MoE holds no
  quantizable layer."""
  x = _x()
  params = _Net().init(jax.random.key(0), x)
  quantized = fq.quantize(_Net(), [fq.Rule(".*", "nvfp4_rtn")], defaults=())
  assert list(quantized.plan(lambda: _Net().apply(params, x))) == ["proj"]
  layer = qnnx.MoE(D, HIDDEN, E, TOP_K, recipe="bf16", rngs=nnx.Rngs(0))
  assert "router" not in "".join(qnnx.layers(layer))


# slow tier; default representative: test_rules_plan_the_dense_layers_and_never_the_router (the plan the rules give)
@pytest.mark.slow
def test_rules_never_reach_the_router():
  """A catch-all rule quantizes the dense layers only: the router is a float32 product, not a Dense/Linear, so the
  plan lists only ``proj`` (linen) / the quantizable Linear (NNX), and the routed MoE output of the rule-quantized
  model equals the bf16 MoE applied to the quantized projection's output."""
  x = _x()
  params = _Net().init(jax.random.key(0), x)
  quantized = fq.quantize(_Net(), [fq.Rule(".*", "nvfp4_rtn")], defaults=())
  assert list(quantized.plan(lambda: _Net().apply(params, x))) == ["proj"]
  h, y = quantized.apply(params, x)
  moe = qlinen.MoE(E, TOP_K, HIDDEN, recipe="bf16")
  want = moe.apply({"params": params["params"]["moe"]}, h)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
  assert not np.array_equal(np.asarray(h), np.asarray(_Net().apply(params, x)[0]))  # proj did quantize
  layer = qnnx.MoE(D, HIDDEN, E, TOP_K, recipe="bf16", rngs=nnx.Rngs(0))
  assert "router" not in "".join(qnnx.layers(layer))  # NNX: no quantizable layer inside the MoE
