"""Shapes in fp4jax.dot_general / einsum: ragged Hadamard chunks are zero-padded (against NumPy oracles), empty
operands and sharded shapes that break ``Recipe.shape_rules`` fail when the FORWARD is traced, naming the user's dim."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax._src import recipes, sharding
from fp4jax._src.recipes import OperandSpec, Recipe
from tests.numpy_reference import nvfp4_reference

DN = (((1,), (1,)), ((), ()))
TE_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float64)  # TE's mask 0xD7E8


def _sylvester(d):
  h = np.ones((1, 1))
  while h.shape[0] < d:
    h = np.kron(np.array([[1, 1], [1, -1]]), h)
  return h


def _rotate_rows(a, d, signs):
  """NumPy oracle: zero-pad the last axis of 2D ``a`` to a multiple of d, then each d-chunk times diag(s)·H_d/√d."""
  n = a.shape[-1]
  a = np.pad(np.asarray(a, np.float64), ((0, 0), (0, -n % d)))
  t = np.diag(signs) @ _sylvester(d) / np.sqrt(d)
  return (a.reshape(a.shape[0], -1, d) @ t).reshape(a.shape[0], -1)


def _ints(seed, shape):
  """Small integers as float32: every Hadamard sum and its 1/4 scaling are exact, so oracle and library agree bit
  for bit before quantization."""
  return np.random.default_rng(seed).integers(-7, 8, shape).astype(np.float32)


def _grads(fn, x, w, dy):
  """(y, dx, dw) of ``fn``'s forward and VJP, jitted (one compile instead of eager op-by-op dispatch: about a third of
  the time; eager equals jitted bit for bit, tests/test_public_variants.py)."""

  def run(x, w, dy):
    y, vjp = jax.vjp(fn, x, w)
    return (y, *vjp(dy))

  return tuple(np.asarray(t, np.float64) for t in jax.jit(run)(jnp.asarray(x), jnp.asarray(w), jnp.asarray(dy)))


ROTATE_ONLY = OperandSpec(hadamard=16, signs="fixed")
ROTATE_ONLY_FROM_FWD = dataclasses.replace(ROTATE_ONLY, source="forward")


# slow tier; default representative: [source1] (the input-sourced backward operands: test_single_element_*)
@pytest.mark.parametrize("source", [pytest.param(ROTATE_ONLY, marks=pytest.mark.slow), ROTATE_ONLY_FROM_FWD])
def test_ragged_hadamard_chunks_cancel_in_every_gemm(source):
  """Rotation without quantization on M = 24, N = 40, K = 20 (none a multiple of 16): all three GEMMs must give the
  plain products (the padded rotation is orthogonal and cancels; from-forward operands go back through the inverse
  rotation and are cropped to K)."""
  r = Recipe("rot", ROTATE_ONLY, ROTATE_ONLY, ROTATE_ONLY, source, ROTATE_ONLY, source)
  x, w, dy = (
    np.random.default_rng(i).standard_normal(s).astype(np.float32) for i, s in enumerate([(24, 20), (40, 20), (24, 40)])
  )
  y, dx, dw = _grads(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=r), x, w, dy)
  x64, w64, dy64 = (np.asarray(a, np.float64) for a in (x, w, dy))
  for got, want in ((y, x64 @ w64.T), (dx, dy64 @ w64), (dw, dy64.T @ x64)):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_ragged_rht_gemms_match_numpy_nvfp4_oracle():
  """NVFP4 RTN after TE's 16-point RHT in the forward (K = 20) and the weight gradient (M = 24): each operand is
  the padded, rotated tensor quantized by the TE-order NumPy reference, the contraction over the padded length."""
  spec = OperandSpec(fmt=fp4jax.NVFP4, hadamard=16, signs="te")
  r = Recipe("rht_ragged", fwd_lhs=spec, fwd_rhs=spec, wgrad_lhs=spec, wgrad_rhs=spec)
  x, w, dy = _ints(1, (24, 20)), _ints(2, (32, 20)), _ints(3, (24, 32))
  y, dx, dw = _grads(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=r), x, w, dy)

  def gemm(a, b):  # Q(pad(a)·T) · Q(pad(b)·T)ᵀ, both quantized along the contraction
    qa, qb = (nvfp4_reference(_rotate_rows(m, 16, TE_SIGNS).astype(np.float32))[3].astype(np.float64) for m in (a, b))
    return qa @ qb.T, np.abs(qa) @ np.abs(qb).T

  for got, (want, bound) in ((y, gemm(x, w)), (dw, gemm(dy.T, x.T))):
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= 32 * 2.0**-23 * bound)  # fp32 accumulation of exact products
  np.testing.assert_allclose(dx, dy.astype(np.float64) @ w, rtol=1e-6)  # dgrad unquantized


# slow tier; default representative: test_properties.py::test_ms_eden_is_unbiased_and_rtn_is_not (MS-EDEN after a
# random RHT-128), test_ragged_hadamard_chunks_cancel_in_every_gemm (ragged chunks padded, every GEMM)
@pytest.mark.slow
def test_ragged_tokens_and_outputs_keep_the_backward_unbiased():
  """MS-EDEN after a random 128-point RHT on M = 40 and N = 24 tokens/outputs (both padded to 128): the mean over
  keys of dX and dW approaches dY·W and dYᵀ·X within 6 standard errors of the sample mean."""
  eden = OperandSpec(fmt=fp4jax.NVFP4, rounding="eden", hadamard=128, signs="random")
  r = Recipe("eden_ragged", dgrad_lhs=eden, dgrad_rhs=eden, wgrad_lhs=eden, wgrad_rhs=eden)
  x, w, dy = (jax.random.normal(jax.random.key(i), s) for i, s in enumerate([(40, 16), (24, 16), (40, 24)]))

  def grads(key):
    _, vjp = jax.vjp(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=r, key=key), x, w)
    return vjp(dy)

  n = 512
  dx, dw = jax.jit(jax.vmap(grads))(jax.random.split(jax.random.key(9), n))
  x64, w64, dy64 = (np.asarray(a, np.float64) for a in (x, w, dy))
  for samples, exact in ((np.asarray(dx, np.float64), dy64 @ w64), (np.asarray(dw, np.float64), dy64.T @ x64)):
    sem = samples.std(axis=0, ddof=1) / np.sqrt(n)
    assert np.all(np.abs(samples.mean(axis=0) - exact) <= 6 * sem + 1e-6)
    assert np.all(sem > 0)  # the backward is quantized: the samples differ


# slow tier; default representative: [nvidia_nvfp4-dot_general] (K = 7 padded to 16-blocks, 16x16 weight tiles and
# the 16-point RHT on ragged tokens); einsum lowers to the same dot_general (test_dot.py's einsum tests)
@pytest.mark.parametrize(
  "name, call",
  [
    (n, "dot_general") if n == "nvidia_nvfp4" else pytest.param(n, "dot_general", marks=pytest.mark.slow)
    for n in recipes.names()
    if not recipes.get(n).is_identity
  ]
  + [pytest.param("quartet2", "einsum", marks=pytest.mark.slow)],
)
def test_ragged_shapes_train_with_every_recipe(name, call):
  """M, N, K = 3, 5, 7 (batched): forward and both gradients finite and of the input shapes."""
  x, w = jax.random.normal(jax.random.key(1), (2, 3, 7)), jax.random.normal(jax.random.key(2), (2, 5, 7))
  if call == "dot_general":
    f = lambda a, b: fp4jax.dot_general(a, b, (((2,), (2,)), ((0,), (0,))), recipe=name, key=jax.random.key(0))
  else:
    f = lambda a, b: fp4jax.einsum("bmk,bnk->bmn", a, b, recipe=name, key=jax.random.key(0))
  y, (dx, dw) = jax.jit(jax.value_and_grad(lambda a, b: jnp.sum(f(a, b) ** 2), (0, 1)))(x, w)
  assert dx.shape == x.shape and dw.shape == w.shape
  assert all(bool(jnp.all(jnp.isfinite(t))) for t in (y, dx, dw))


@pytest.mark.parametrize("name", [n for n in recipes.names() if not recipes.get(n).is_identity])
def test_empty_operands_fail_in_the_forward_naming_the_argument(name):
  x, w = jnp.ones((0, 32)), jnp.ones((16, 32))
  with pytest.raises(ValueError, match=r"fp4jax.dot_general\(recipe='\w+'\): lhs of shape \(0, 32\) is empty"):
    jax.eval_shape(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=name, key=jax.random.key(0)), x, w)
  with pytest.raises(ValueError, match=r"fp4jax.einsum\(recipe='\w+'\): a of shape \(8, 0\) is empty"):
    fp4jax.einsum("mk,nk->mn", jnp.ones((8, 0)), jnp.ones((16, 0)), recipe=name, key=jax.random.key(0))


def test_single_element_operands_are_not_empty():
  """1 x 1 operands are the smallest non-empty ones: they multiply (rotation-only recipe, K = 1 zero-padded to one
  16-chunk: 2 and 3 rotate to ±1/2 and ±3/4, whose 16 products sum exactly to 6) and differentiate (dx = dy·w,
  dw = dy·x), by hand."""
  r = Recipe("rot", ROTATE_ONLY, ROTATE_ONLY, ROTATE_ONLY, ROTATE_ONLY, ROTATE_ONLY, ROTATE_ONLY)
  y, dx, dw = _grads(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=r), [[2.0]], [[3.0]], [[0.5]])
  np.testing.assert_array_equal(np.stack([y, dx, dw]), [[[6.0]], [[1.5]], [[1.0]]])


# The rules each recipe's paper choices imply (read off the recipes: blocks and Hadamard sizes per GEMM, 2D tiles).
EXPECTED_RULES = {
  "nvfp4_rtn": {("fwd", "inputs", 16), ("dgrad", "outputs", 16), ("wgrad", "tokens", 16)},
  "nvidia_nvfp4": {("fwd", "inputs", 16), ("dgrad", "outputs", 16), ("wgrad", "tokens", 16), ("fwd", "outputs", 16)},
  "quartet": {("fwd", "inputs", 32), ("dgrad", "outputs", 32), ("wgrad", "tokens", 32)},
  "quartet2": {("fwd", "inputs", 16), ("dgrad", "outputs", 128), ("wgrad", "tokens", 128)},
  "fp8": set(),
  "mxfp8": {("fwd", "inputs", 32), ("dgrad", "outputs", 32), ("wgrad", "tokens", 32)},
  "fp8_block": {("fwd", "inputs", 128), ("dgrad", "outputs", 128), ("wgrad", "tokens", 128), ("fwd", "outputs", 128)},
  "ms_fp4": set(),
  "bf16": set(),
}


@pytest.mark.parametrize("name", recipes.names())
def test_shape_rules_state_each_recipes_units(name):
  assert {(r.gemm, r.dim, r.multiple) for r in recipes.get(name).shape_rules} == EXPECTED_RULES[name]


def _sharded_call(recipe, split, size, call):
  """Local operands (M, N, K) = 256 except the split dim = ``size``, under ``jax.vmap`` over 2 devices named "d"."""
  m, n, k = (size if split == d else 256 for d in recipes.DIMS)
  x, w = jnp.ones((2, m, k)), jnp.ones((2, n, k))
  r = sharding.sharded(recipe, "d", split)
  if call == "dot_general":
    f = lambda a, b: fp4jax.dot_general(a, b, DN, recipe=r, key=jax.random.key(0))
  else:
    f = lambda a, b: fp4jax.einsum("mk,nk->mn", a, b, recipe=r, key=jax.random.key(0))
  grads = jax.grad(lambda a, b: jnp.sum(f(a, b)), (0, 1))
  return jax.vmap(f, axis_name="d"), jax.vmap(grads, axis_name="d"), x, w


# slow tier; default representative: nvidia_nvfp4's four rules (a forward 2D-tile rule, a backward-only rule on the
# tokens), both calls; every recipe's rules themselves: test_shape_rules_state_each_recipes_units
_RULE_CASES = [
  (n, r) if n == "nvidia_nvfp4" else pytest.param(n, r, marks=pytest.mark.slow)
  for n in recipes.names()
  for r in sorted(EXPECTED_RULES[n])
]
_LABELS = {
  "dot_general": {"tokens": "lhs dims (0,)", "outputs": "rhs dims (0,)", "inputs": "lhs dims (1,)"},
  "einsum": {"tokens": "a's 'm'", "outputs": "b's 'n'", "inputs": "a's 'k'"},
}


@pytest.mark.parametrize("name, rule", _RULE_CASES)
@pytest.mark.parametrize("call", ["dot_general", "einsum"])
def test_sharded_shape_rules_fail_when_the_forward_is_traced(name, rule, call):
  """A local split dim that is not a multiple of a rule's unit raises when the FORWARD is traced (also for a
  backward-only rule), naming the recipe, the user's dim and the GEMM; a multiple traces forward and backward."""
  _, dim, multiple = rule
  f, _, x, w = _sharded_call(name, dim, multiple // 2, call)
  label = _LABELS[call][dim]
  first = next(r for r in recipes.get(name).shape_rules if r.dim == dim and multiple // 2 % r.multiple)
  match = re.escape(
    f"fp4jax.{call}(recipe={name!r}): {dim} ({label}) = {multiple // 2} on each device of 'd' must be "
    f"a multiple of {first.multiple} for {name}'s {first.gemm} GEMM"
  )
  with pytest.raises(ValueError, match=match):
    jax.eval_shape(f, x, w)  # the forward alone
  _, grads, x, w = _sharded_call(name, dim, 2 * multiple, call)
  dx, dw = jax.eval_shape(grads, x, w)
  assert (dx.shape, dw.shape) == (x.shape, w.shape)
