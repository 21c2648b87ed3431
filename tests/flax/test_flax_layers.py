"""The FP4 layers: same numbers as fp4jax.dot_general, the recipe's expected error, RNG streams, evaluation mode."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fp4jax
from fp4jax._src import metrics, operand, recipes
from fp4jax._src.flax import linen as ql
from fp4jax._src.flax import nnx as qn

M, K, N = 128, 256, 128
DN = (((1,), (0,)), ((), ()))


def _data():
  kx, kw = jax.random.split(jax.random.key(0))
  return jax.random.normal(kx, (M, K), jnp.float32), jax.random.normal(kw, (K, N), jnp.float32)


@functools.partial(jax.jit, static_argnums=0)
def _expected_relative_mse(recipe, x, w):
  """e_x + e_w: the forward operands' relative MSE (in the Hadamard domain when the recipe rotates; rotations are
  orthogonal). For independent N(0,1) X and W, E‖ΔX·W‖² / E‖X·W‖² = ‖ΔX‖²/‖X‖² (and likewise for W); the cross
  terms are O(e_x·e_w) and products of the two misalignments: measured within 5% of the sum (Quartet, whose
  QuEST scale shrinks both operands, is the largest), so a 15% band separates "quantized as the recipe says" from
  "one operand skipped" (error halves) or "quantized twice" (error doubles)."""
  r = recipes.get(recipe)
  total = 0.0
  for a, spec in ((x, r.fwd_lhs), (w.T, r.fwd_rhs)):
    if spec.hadamard:
      a = operand.rotate(a, spec.hadamard, spec.sign_vector(jax.random.key(1)))
    q, _ = operand.quantize_operand(a, spec, jax.random.key(2))
    total += metrics.relative_mse(a, q.dequantize())
  return total


@pytest.mark.parametrize(
  "recipe",
  # slow tier; default representative: [quartet] (an FP4 recipe whose forward rotates: both branches of the expected
  # error); bf16's identity by test_bf16_recipe_is_exactly_flax, nvfp4_rtn's layers by
  # test_wrappers_match_flax_layers_with_fp4jax_dots
  [r if r == "quartet" else pytest.param(r, marks=pytest.mark.slow) for r in recipes.names()],
)
def test_linen_dense_is_fp4jax_dot_general_with_the_recipes_error(recipe):
  x, w = _data()
  layer = nn.Dense(N, use_bias=False, dot_general_cls=functools.partial(ql.DotGeneral, recipe=recipe))

  @jax.jit
  def outputs(x, w):
    y = layer.apply({"params": {"kernel": w}}, x, rngs={"quant": jax.random.key(3)})
    return y, fp4jax.dot_general(x, w, DN, recipe=recipe, key=jax.random.key(4))

  y, y_ref = outputs(x, w)
  np.testing.assert_array_equal(y, y_ref)  # the forward of every published recipe is deterministic (RTN)
  err = float(metrics.relative_mse(x @ w, y))
  if recipes.get(recipe).is_identity:
    assert err == 0.0
  else:
    expected = float(_expected_relative_mse(recipe, x, w))
    assert 0.85 * expected < err < 1.15 * expected, (err, expected)


def test_wrappers_match_flax_layers_with_fp4jax_dots():
  x, w = _data()
  r = "nvfp4_rtn"
  params = {"params": {"kernel": w}}
  y_dense = ql.Dense(N, use_bias=False, recipe=r).apply(params, x)
  y_general = ql.DenseGeneral(N, use_bias=False, recipe=r).apply(params, x)
  y_einsum = ql.Einsum((K, N), "mk,kn->mn", use_bias=False, recipe=r).apply(params, x)
  y_ref = fp4jax.dot_general(x, w, DN, recipe=r)
  for y in (y_dense, y_general, y_einsum):
    np.testing.assert_array_equal(y, y_ref)
  nnx_lin = qn.Linear(K, N, use_bias=False, recipe=r, rngs=nnx.Rngs(0))
  nnx_lin.kernel[...] = w
  nnx_ein = qn.Einsum("mk,kn->mn", (K, N), recipe=r, rngs=nnx.Rngs(0))
  nnx_ein.kernel[...] = w
  np.testing.assert_array_equal(nnx_lin(x), y_ref)
  np.testing.assert_array_equal(nnx_ein(x), fp4jax.einsum("mk,kn->mn", x, w, recipe=r))


def test_bf16_recipe_is_exactly_flax():
  x, w = _data()
  params = {"params": {"kernel": w}}
  f = lambda layer: jax.grad(lambda p: jnp.sum(jnp.sin(layer.apply(p, x))))(params)
  g = f(ql.Dense(N, use_bias=False, recipe="bf16"))
  g_ref = f(nn.Dense(N, use_bias=False))
  np.testing.assert_array_equal(g["params"]["kernel"], g_ref["params"]["kernel"])


class _TwoLayers(nn.Module):
  """Two Dense layers applied to the same input with the same kernel: only their random bits differ."""

  @nn.compact
  def __call__(self, x):
    a = ql.Dense(N, use_bias=False, recipe="nvidia_nvfp4", name="a")
    b = ql.Dense(N, use_bias=False, recipe="nvidia_nvfp4", name="b")
    return a(x) + b(x)


@jax.jit
def _linen_kernel_grads(x, w, key):
  params = {"params": {"a": {"kernel": w}, "b": {"kernel": w}}}
  loss = lambda p: jnp.sum(jnp.sin(_TwoLayers().apply(p, x, rngs={"quant": key})))
  g = jax.grad(loss)(params)["params"]
  return g["a"]["kernel"], g["b"]["kernel"]


def test_linen_quant_stream_gives_distinct_bits_per_layer_and_step():
  x, w = _data()
  ga, gb = _linen_kernel_grads(x, w, jax.random.key(7))
  ga2, _ = _linen_kernel_grads(x, w, jax.random.key(7))
  ga3, _ = _linen_kernel_grads(x, w, jax.random.key(8))
  np.testing.assert_array_equal(ga, ga2)  # same key, same bits
  assert not np.array_equal(ga, gb)  # two layers: the stream is folded with the module path
  assert not np.array_equal(ga, ga3)  # a new key per step gives new bits


def test_linen_random_recipe_without_quant_stream_is_named_while_tracing():
  """The tracing half of the slow test below: a random recipe without the "quant" stream raises naming it, RTN and
  init need none, and the deterministic variant of the recipe draws no bits."""
  _check_quant_stream_is_named_while_tracing(*_data())
  assert not recipes.deterministic(recipes.get("nvidia_nvfp4")).is_random


def _check_quant_stream_is_named_while_tracing(x, w):
  params = {"params": {"kernel": w}}
  layer = ql.Dense(N, use_bias=False, recipe="nvidia_nvfp4")
  with pytest.raises(ValueError, match=r"'nvidia_nvfp4'.*'quant' RNG stream"):
    jax.eval_shape(lambda: layer.apply(params, x))  # the error is raised while tracing
  jax.eval_shape(lambda: ql.Dense(N, use_bias=False, recipe="nvfp4_rtn").apply(params, x))  # RTN: no stream needed
  jax.eval_shape(lambda: layer.init(jax.random.key(0), x))  # init: keys from the "params" stream


# slow tier; default representative: test_linen_random_recipe_without_quant_stream_is_named_while_tracing (its tracing
# checks) and test_nnx_quant_stream_and_eval_mode (the deterministic layer runs without a stream)
@pytest.mark.slow
def test_linen_random_recipe_needs_quant_stream_unless_deterministic():
  x, w = _data()
  params = {"params": {"kernel": w}}
  _check_quant_stream_is_named_while_tracing(x, w)
  eval_layer = ql.Dense(N, use_bias=False, recipe="nvidia_nvfp4", deterministic=True)
  run = recipes.deterministic(recipes.get("nvidia_nvfp4"))
  assert not run.is_random

  @jax.jit
  def grads(params, w):
    g = jax.grad(lambda p: jnp.sum(jnp.sin(eval_layer.apply(p, x))))(params)["params"]["kernel"]
    return g, jax.grad(lambda w: jnp.sum(jnp.sin(fp4jax.dot_general(x, w, DN, recipe=run))))(w)

  g, g_ref = grads(params, w)
  np.testing.assert_array_equal(g, g_ref)


def test_nnx_quant_stream_and_eval_mode():
  x, w = _data()
  rngs = nnx.Rngs(params=0, quant=1)
  a = qn.Linear(K, N, use_bias=False, recipe="nvidia_nvfp4", rngs=rngs)
  b = qn.Linear(K, N, use_bias=False, recipe="nvidia_nvfp4", rngs=rngs)
  a.kernel[...] = b.kernel[...] = w

  @nnx.jit
  def grads(a, b):
    return nnx.grad(lambda a, b: jnp.sum(jnp.sin(a(x) + b(x))), argnums=(0, 1))(a, b)

  ga, gb = grads(a, b)
  ga2, _ = grads(a, b)
  assert not np.array_equal(ga.kernel[...], gb.kernel[...])  # each layer forks its own stream
  assert not np.array_equal(ga.kernel[...], ga2.kernel[...])  # the stream advances through nnx.jit

  bare = qn.Linear(K, N, use_bias=False, recipe="nvidia_nvfp4", rngs=nnx.Rngs(params=0))
  with pytest.raises(ValueError, match=r"'quant' RNG stream"):
    bare(x)
  bare.eval()  # nnx's evaluation mode sets deterministic=True on the FP4 op
  assert bare.dot_general.deterministic
  bare(x)


def test_backend_field_reaches_dot_general():
  """The tracing half of the slow test below: linen Dense and nnx Linear with backend="pallas" call the fused kernels
  (``pallas_call`` in their jaxprs)."""
  m, k, n = 32, 64, 32
  kx, kw = jax.random.split(jax.random.key(5))
  x, w = jax.random.normal(kx, (m, k), jnp.bfloat16), jax.random.normal(kw, (k, n), jnp.bfloat16)
  dense = ql.Dense(n, use_bias=False, recipe="nvfp4_rtn", backend="pallas")
  linear = qn.Linear(k, n, use_bias=False, recipe="nvfp4_rtn", backend="pallas", rngs=nnx.Rngs(0))
  assert "pallas_call" in str(jax.make_jaxpr(lambda x: dense.apply({"params": {"kernel": w}}, x))(x))
  assert "pallas_call" in str(jax.make_jaxpr(lambda x: linear(x))(x))  # the field reaches fp4jax.dot_general


# slow tier; default representative: test_backend_field_reaches_dot_general (the field reaches the dot) and
# tests/kernels/test_dot_pallas.py::test_pallas_backend_matches_xla_bit_for_bit[nvidia_nvfp4] (that dot's bits)
@pytest.mark.slow
def test_backend_field_reaches_dot_general_and_pallas_gives_the_same_bits():
  """linen Dense and nnx Linear with backend="pallas" (the fused quantize kernels; Pallas interpret mode on CPU):
  outputs and kernel/input gradients bit-identical to backend="xla" for nvidia_nvfp4 (SR and RHT-16 in the
  backward). A tiny shape: interpret mode is slow."""
  m, k, n = 32, 64, 32
  kx, kw = jax.random.split(jax.random.key(5))
  x, w = jax.random.normal(kx, (m, k), jnp.bfloat16), jax.random.normal(kw, (k, n), jnp.bfloat16)

  def linen_run(backend):
    layer = ql.Dense(
      n, use_bias=False, recipe="nvidia_nvfp4", backend=backend, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16
    )
    f = lambda p, x: jnp.sum(layer.apply(p, x, rngs={"quant": jax.random.key(3)}).astype(jnp.float32) ** 2)
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))({"params": {"kernel": w}}, x)

  def nnx_run(backend):
    layer = qn.Linear(
      k,
      n,
      use_bias=False,
      recipe="nvidia_nvfp4",
      backend=backend,
      rngs=nnx.Rngs(0, quant=3),
      dtype=jnp.bfloat16,
      param_dtype=jnp.bfloat16,
    )
    layer.kernel[...] = w
    f = lambda layer, x: jnp.sum(layer(x).astype(jnp.float32) ** 2)
    loss, (g_layer, g_x) = nnx.jit(nnx.value_and_grad(f, argnums=(0, 1)))(layer, x)
    return loss, (g_layer.kernel[...], g_x)

  dense = ql.Dense(n, use_bias=False, recipe="nvfp4_rtn", backend="pallas")
  linear = qn.Linear(k, n, use_bias=False, recipe="nvfp4_rtn", backend="pallas", rngs=nnx.Rngs(0))
  assert "pallas_call" in str(jax.make_jaxpr(lambda x: dense.apply({"params": {"kernel": w}}, x))(x))
  assert "pallas_call" in str(jax.make_jaxpr(lambda x: linear(x))(x))  # the field reaches fp4jax.dot_general
  for run in (linen_run, nnx_run):
    got, want = jax.tree.leaves(run("pallas")), jax.tree.leaves(run("xla"))
    assert len(got) == len(want) == 3
    for g, r in zip(got, want):
      assert np.any(np.asarray(r, np.float32) != 0)
      np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(r, np.float32))


def test_bad_backend_is_named():
  with pytest.raises(ValueError, match="backend must be one of"):
    ql.Dense(N, recipe="nvfp4_rtn", backend="cuda")
  with pytest.raises(ValueError, match="backend must be one of"):
    ql.Einsum((K, N), "mk,kn->mn", recipe="nvfp4_rtn", backend="cuda")
  with pytest.raises(ValueError, match=r"nnx\.DotGeneral: backend must be one of"):
    qn.Linear(K, N, recipe="nvfp4_rtn", backend="cuda", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="backend must be one of"):
    ql.quantize(nn.Dense(N), [], backend="cuda")
