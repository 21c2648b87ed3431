"""fp4jax.dot_general / einsum: exactness of bf16, canonicalization, per-GEMM quantization axes, transformations."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax._src import operand as operand_lib
from fp4jax._src import recipes
from fp4jax._src.recipes import OperandSpec, Recipe

DN = (((1,), (1,)), ((), ()))
KEY = jax.random.key(0)
# A recipe that rotates but does not quantize: exercises canonicalization and the custom VJP with exact numerics.
ROTATE_ONLY = Recipe("rotate_only", *(OperandSpec(hadamard=16, signs="fixed"),) * 2)
# Shapes whose every GEMM axis suits every recipe (Quartet II's backward RHT-128 needs M, N multiples of 128).
SHAPES = {"quartet2": (128, 64, 128)}


def _normal(seed, shape, dtype=jnp.float32):
  return jax.random.normal(jax.random.key(seed), shape, dtype)


def _value_and_grads(fn, a, b, dy):
  """Jitted ``(y, da, db)`` of ``fn(a, b)`` for the cotangent ``dy`` (one compilation per test)."""

  def run(a, b, dy):
    y, vjp = jax.vjp(fn, a, b)
    return (y, *vjp(dy.astype(y.dtype)))

  return jax.jit(run)(a, b, dy)


def _out_shape(fn, a, b):
  return jax.eval_shape(fn, a, b).shape


CASES = [  # (lhs shape, rhs shape, dimension_numbers)
  ((32, 64), (48, 64), DN),
  ((4, 8, 32), (4, 16, 32), (((2,), (2,)), ((0,), (0,)))),  # batch dim
  ((8, 4, 16), (4, 16, 24), (((1, 2), (0, 1)), ((), ()))),  # two contracting dims, rhs contracting first
  ((16, 3, 32), (32, 5, 3), (((-1, 1), (0, 2)), ((), ()))),  # negative dims, interleaved
  ((2, 16, 3, 32), (3, 2, 32, 8), (((3,), (2,)), ((0, 2), (1, 0)))),  # two batch dims in another order
]


def _cases(keep: int) -> list:
  """``CASES`` with all but ``CASES[keep]`` in the slow tier (each case compiles its own pair of programs)."""
  slow = pytest.mark.slow  # slow tier; default representative: CASES[keep] (see each test's decorator)
  return [case if i == keep else pytest.param(*case, marks=slow) for i, case in enumerate(CASES)]


def _nonnegative(dn, lhs_shape, rhs_shape):
  """lax.dot_general wants non-negative dims; fp4jax accepts negative ones."""
  norm = lambda pair: tuple(tuple(d % len(s) for d in dims) for dims, s in zip(pair, (lhs_shape, rhs_shape)))
  return norm(dn[0]), norm(dn[1])


# default: CASES[3], negative and interleaved contracting dims; test_canonicalization_through_the_custom_vjp keeps
# CASES[4], two batch dims in another order
@pytest.mark.parametrize("lhs_shape, rhs_shape, dn", _cases(3))
def test_bf16_recipe_is_lax_dot_general_bit_for_bit(lhs_shape, rhs_shape, dn):
  a, b = _normal(1, lhs_shape, jnp.bfloat16), _normal(2, rhs_shape, jnp.bfloat16)
  dn_lax = _nonnegative(dn, lhs_shape, rhs_shape)
  ref = lambda a, b: jax.lax.dot_general(a, b, dn_lax, preferred_element_type=jnp.float32)
  ours = lambda a, b: fp4jax.dot_general(a, b, dn, recipe="bf16", preferred_element_type=jnp.float32)
  dy = _normal(3, _out_shape(ref, a, b))
  y_ref, *g_ref = _value_and_grads(ref, a, b, dy)
  y, *g = _value_and_grads(ours, a, b, dy)
  assert y.dtype == y_ref.dtype == jnp.float32
  np.testing.assert_array_equal(y, y_ref)
  for gi, gi_ref in zip(g, g_ref):
    assert gi.dtype == jnp.bfloat16
    np.testing.assert_array_equal(gi, gi_ref)


@pytest.mark.parametrize("lhs_shape, rhs_shape, dn", _cases(4))  # default: two batch dims in another order
def test_canonicalization_through_the_custom_vjp(lhs_shape, rhs_shape, dn):
  """A rotation-only recipe runs the full custom VJP (rotate, GEMMs, inverse mapping): equal to lax up to f32."""
  a, b = _normal(1, lhs_shape), _normal(2, rhs_shape)
  dn_lax = _nonnegative(dn, lhs_shape, rhs_shape)
  ref = lambda a, b: jax.lax.dot_general(a, b, dn_lax, precision="highest")
  dy = _normal(3, _out_shape(ref, a, b))
  y_ref, *g_ref = _value_and_grads(ref, a, b, dy)
  y, *g = _value_and_grads(lambda a, b: fp4jax.dot_general(a, b, dn, recipe=ROTATE_ONLY), a, b, dy)
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-4)
  for gi, gi_ref in zip(g, g_ref):
    np.testing.assert_allclose(gi, gi_ref, rtol=1e-5, atol=1e-4)


def test_native_backend_runs_a_recipe_that_quantizes_nothing_forward_and_backward():
  """``backend="native"`` has no quantizer: a recipe that only rotates runs on XLA, its gradients too (no pair of
  operands for one kernel, rather than a ValueError), and the rotations cancel: y, dX, dW are the float64 products."""
  x, w, dy = _normal(1, (32, 64)), _normal(2, (48, 64)), _normal(3, (32, 48))
  fn = lambda a, b: fp4jax.dot_general(a, b, DN, recipe=ROTATE_ONLY, backend="native")  # noqa: E731
  y, dx, dw = _value_and_grads(fn, x, w, dy)
  x64, w64, dy64 = (np.asarray(t, np.float64) for t in (x, w, dy))
  for got, want in ((y, x64 @ w64.T), (dx, dy64 @ w64), (dw, dy64.T @ x64)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def _fq(x, axis, **kw):
  return fp4jax.fake_quantize(x, fp4jax.NVFP4, axis=axis, dtype=jnp.float32, **kw)


# slow tier; default representative: test_oracles_dot.py::test_forward_and_gradients_equal_the_numpy_oracle[nvfp4_rtn]
# (the oracle quantizes each GEMM's operands along that GEMM's contraction axis)
@pytest.mark.slow
def test_each_gemm_quantizes_both_operands_along_its_own_contraction_axis():
  """nvfp4_rtn: fwd Q_K(X)·Q_K(W)ᵀ, dgrad Q_N(dY)·Q_N(W), wgrad Q_M(dY)ᵀ·Q_M(X), against fake_quantize."""
  x, w, dy = _normal(1, (32, 64)), _normal(2, (48, 64)), _normal(3, (32, 48))
  y, dx, dw = _value_and_grads(lambda a, b: fp4jax.dot_general(a, b, DN, recipe="nvfp4_rtn"), x, w, dy)

  @jax.jit
  def reference(x, w, dy):
    mm = lambda a, b: jnp.matmul(a, b, precision="highest")
    return mm(_fq(x, 1), _fq(w, 1).T), mm(_fq(dy, 1), _fq(w, 0)), mm(_fq(dy, 0).T, _fq(x, 0))

  # Tensor scales are applied after the GEMM (hardware order), fake_quantize before: equal up to f32 rounding.
  for got, want in zip((y, dx, dw), reference(x, w, dy)):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


# slow tier; default representative: test_oracles_dot.py::test_forward_and_gradients_equal_the_numpy_oracle
# [nvidia_nvfp4] (the oracle quantizes W in 16x16 tiles forward and reuses them in dgrad, as the recipe's specs say)
@pytest.mark.slow
def test_nvidia_forward_uses_2d_weight_tiles_and_reuses_them_for_dgrad():
  x, w, dy = _normal(1, (32, 64)), _normal(2, (48, 64)), _normal(3, (32, 48))
  # With dY's SR removed, dgrad is exactly dY·Ŵ with the forward's 2D tiles.
  no_sr = dataclasses.replace(recipes.get("nvidia_nvfp4"), dgrad_lhs=recipes.HIGH_PRECISION)
  y, dx, _ = _value_and_grads(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=no_sr, key=KEY), x, w, dy)
  w2d = jax.jit(lambda w: _fq(w, 1, block_shape=(16, 16)))(w)
  x1d = jax.jit(lambda x: _fq(x, 1))(x)
  np.testing.assert_allclose(y, jnp.matmul(x1d, w2d.T, precision="highest"), rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(dx, jnp.matmul(dy, w2d, precision="highest"), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(  # slow tier; default representative: [nvidia_nvfp4] (the key handling is the dot's)
  "name",
  [
    n if n == "nvidia_nvfp4" else pytest.param(n, marks=pytest.mark.slow)
    for n in recipes.names()
    if recipes.get(n).is_random
  ],
)
def test_random_recipes_need_a_key_and_are_deterministic_given_one(name):
  m, k, n = SHAPES.get(name, (32, 64, 64))
  x, w, dy = _normal(1, (m, k)), _normal(2, (n, k)), _normal(3, (m, n))
  with pytest.raises(ValueError, match=name):
    fp4jax.dot_general(x, w, DN, recipe=name)
  grads = jax.jit(lambda key: jax.vjp(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=name, key=key), x, w)[1](dy))
  g1, g2, g3 = grads(KEY), grads(KEY), grads(jax.random.key(1))
  for a, b, c in zip(g1, g2, g3):
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def _stacked_loss(name, key):
  """Scan over 2 layers of a per-example (vmap) quantized linear map, rematerialized, squared-error loss.

  Weights f32, activations bf16, outputs requested in f32 (``preferred_element_type``) and carried in bf16.
  """

  def layer(h, wk):
    w, k = wk
    dot = lambda h, w: fp4jax.dot_general(h, w, DN, recipe=name, key=k, preferred_element_type=jnp.float32)
    y = jax.checkpoint(dot)(h, w)
    assert y.dtype == jnp.float32  # checked while tracing
    return y.astype(h.dtype), None

  def loss(ws, xs):
    keys = None if key is None else jax.random.split(key, ws.shape[0])
    per_example = lambda x: jax.lax.scan(layer, x, (ws, keys))[0]
    return jnp.mean(jnp.square(jax.vmap(per_example)(xs).astype(jnp.float32)))

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


@pytest.mark.parametrize(  # slow tier; default representative: [nvidia_nvfp4] (SR, RHT, 2D tiles, a key per layer)
  "name", [r if r == "nvidia_nvfp4" else pytest.param(r, marks=pytest.mark.slow) for r in recipes.names()]
)
def test_every_recipe_under_jit_grad_vmap_scan_checkpoint(name):
  d = 128 if name == "quartet2" else 64  # Quartet II's backward RHT-128 runs along tokens and outputs
  ws = _normal(1, (2, d, d)) / np.sqrt(d)
  xs = _normal(2, (3, d, d), jnp.bfloat16)  # (vmap, tokens, features)
  key = KEY if recipes.get(name).is_random else None
  value, (gw, gx) = _stacked_loss(name, key)(ws, xs)
  exact_value, (exact_gw, _) = _stacked_loss("bf16", None)(ws, xs.astype(jnp.float32))
  assert gw.dtype == jnp.float32 and gx.dtype == jnp.bfloat16
  assert gw.shape == ws.shape and gx.shape == xs.shape
  assert np.isfinite(value) and np.all(np.isfinite(gw)) and np.all(np.isfinite(gx))
  assert abs(float(value) / float(exact_value) - 1) < 0.5  # Quartet's QuEST clipping shrinks outputs most
  cos = fp4jax.metrics.cosine(gw, exact_gw)
  assert cos > (0.5 if name == "ms_fp4" else 0.8), cos  # DGE rescales each weight gradient by 0.2 ... 3


@pytest.mark.parametrize("name", recipes.names())
def test_default_output_dtype_follows_lax(name):
  x, w = jnp.ones((128, 64), jnp.bfloat16), jnp.ones((128, 64), jnp.float32)
  key = KEY if recipes.get(name).is_random else None
  f = lambda a, b: fp4jax.dot_general(a, b, DN, recipe=name, key=key)
  assert jax.eval_shape(f, x, x).dtype == jnp.bfloat16
  assert jax.eval_shape(f, x, w).dtype == jnp.float32


@pytest.mark.parametrize("name", ["fp8", "nvidia_nvfp4"])
def test_quantized_gemms_multiply_at_float32_on_the_cpu_only(name, jaxpr_equations):
  """XLA:CPU runs a bf16 dot either on AVX512-BF16 pair dot products or upcast to f32, chosen per program, and the
  two round inexact sums differently: fp8's tensor-parallel training differed from one device by that choice
  (BENCHMARKS.md §9 at commit 83b474b). ``fp4jax._src.operand.matmul`` hands the CPU f32 operands, accelerators
  the exact bf16 values."""
  x, w = _normal(1, (32, 64)).astype(jnp.bfloat16), _normal(2, (48, 64))
  key = KEY if recipes.get(name).is_random else None
  jaxpr = jax.make_jaxpr(jax.grad(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=name, key=key).sum(), (0, 1)))(x, w)
  dots = [e for e in jaxpr_equations(jaxpr.jaxpr) if e.primitive.name == "dot_general"]
  expected = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
  assert len(dots) == 3  # forward, dgrad, wgrad
  assert all(v.aval.dtype == expected for e in dots for v in e.invars), [[v.aval for v in e.invars] for e in dots]


def test_bf16_parts_add_up_exactly():
  rng = np.random.default_rng(0)
  x = (rng.standard_normal(4096) * np.exp2(rng.integers(-100, 100, 4096))).astype(np.float32)
  parts = operand_lib.bf16_parts(jnp.asarray(x))
  assert all(p.dtype == jnp.bfloat16 for p in parts)
  np.testing.assert_array_equal(sum(np.asarray(p, np.float64) for p in parts), x.astype(np.float64))


def test_per_row_scales_scale_the_output_rows_and_columns():
  a = operand_lib.Operand(_normal(1, (2, 8, 32)).astype(jnp.bfloat16), jnp.exp2(_normal(2, (2, 8, 1))))
  b = operand_lib.Operand(_normal(3, (2, 4, 32)).astype(jnp.bfloat16), jnp.exp2(_normal(4, (2, 4, 1))))
  y = operand_lib.matmul(a, b)
  ref = jnp.einsum("brk,bsk->brs", a.dequantize(), b.dequantize(), precision="highest")
  np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_a_float32_operand_meets_bf16_values_as_three_bf16_gemms_on_accelerators(monkeypatch, jaxpr_equations):
  """Off the CPU, OCC's float32 operand times per-channel E2M1 weights runs as three bf16 GEMMs of its exact
  ``bf16_parts``: every product exact, so the result is a float32 GEMM's up to the fp32 accumulation."""
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.standard_normal((1, 16, 256)), jnp.float32)  # not bf16-exact
  w_op, _ = fp4jax._src.operand.quantize_operand(
    _normal(6, (1, 24, 256)), OperandSpec(fmt=fp4jax._src.formats.E2M1_CHANNEL), None
  )
  x_op = operand_lib.Operand(x, jnp.float32(1.0))
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  jaxpr = jax.make_jaxpr(operand_lib.matmul)(x_op, w_op)
  dots = [e for e in jaxpr_equations(jaxpr.jaxpr) if e.primitive.name == "dot_general"]
  assert len(dots) == 3 and all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars)
  y = np.asarray(operand_lib.matmul(x_op, w_op), np.float64)
  monkeypatch.undo()
  a, b = np.asarray(x, np.float64), np.asarray(w_op.dequantize(), np.float64)
  exact, bound = np.einsum("brk,bsk->brs", a, b), np.einsum("brk,bsk->brs", np.abs(a), np.abs(b))
  assert np.all(np.abs(y - exact) <= 256 * 2.0**-23 * bound)  # fp32 accumulation of 256 exact products


def test_nan_and_inf_propagate():
  x, w = _normal(1, (32, 64)), _normal(2, (48, 64))
  for name in ("nvfp4_rtn", "fp8", "ms_fp4"):
    f = jax.jit(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=name))
    assert not np.all(np.isfinite(f(x.at[3, 5].set(jnp.nan), w))), name
    assert not np.all(np.isfinite(f(x, w.at[0, 0].set(jnp.inf)))), name


def test_bad_arguments():
  x, w = _normal(1, (32, 64)), _normal(2, (48, 64))
  with pytest.raises(ValueError, match="unknown recipe"):
    fp4jax.dot_general(x, w, DN, recipe="fp2")
  with pytest.raises(TypeError, match="lhs must be a floating-point"):
    fp4jax.dot_general(jnp.ones((32, 64), jnp.int32), w, DN, recipe="nvfp4_rtn")
  with pytest.raises(ValueError, match="must match"):
    fp4jax.dot_general(x, w, (((1,), (0,)), ((), ())), recipe="nvfp4_rtn")
  with pytest.raises(ValueError, match="out of range"):
    fp4jax.dot_general(x, w, (((2,), (1,)), ((), ())), recipe="nvfp4_rtn")
  with pytest.raises(ValueError, match="backend"):
    fp4jax.dot_general(x, w, DN, recipe="nvfp4_rtn", backend="cuda")


_SLOW = pytest.mark.slow  # slow tier; default representative: "bsk,nk->nbs" (free dims of a batch, output permuted)


@pytest.mark.parametrize(
  "spec, a_shape, b_shape",
  [
    pytest.param("bsk,nk->bsn", (2, 16, 32), (24, 32), marks=_SLOW),
    ("bsk,nk->nbs", (2, 16, 32), (24, 32)),
    pytest.param("bik,bjk->bij", (3, 16, 32), (3, 8, 32), marks=_SLOW),
    pytest.param("ik,jk", (16, 32), (8, 32), marks=_SLOW),  # implicit output: "ij"
    pytest.param("ikz,jk->ij", (16, 32, 3), (8, 32), marks=_SLOW),  # z summed out of a first
  ],
)
def test_einsum_matches_jnp_einsum(spec, a_shape, b_shape):
  a, b = _normal(1, a_shape), _normal(2, b_shape)
  ref = lambda a, b: jnp.einsum(spec, a, b, precision="highest")
  dy = _normal(3, _out_shape(ref, a, b))
  y, *g = _value_and_grads(lambda a, b: fp4jax.einsum(spec, a, b, recipe=ROTATE_ONLY), a, b, dy)
  y_ref, *g_ref = _value_and_grads(ref, a, b, dy)
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-4)
  for gi, gi_ref in zip(g, g_ref):
    np.testing.assert_allclose(gi, gi_ref, rtol=1e-5, atol=1e-4)


def test_einsum_quantizes_like_dot_general():
  a, b = _normal(1, (2, 16, 64)), _normal(2, (48, 64))
  y = jax.jit(lambda a, b: fp4jax.einsum("bsk,nk->bsn", a, b, recipe="nvfp4_rtn"))(a, b)
  y_dot = jax.jit(lambda a, b: fp4jax.dot_general(a, b, (((2,), (1,)), ((), ())), recipe="nvfp4_rtn"))(a, b)
  np.testing.assert_array_equal(y, y_dot)


@pytest.mark.parametrize("spec", ["ij,jk,kl->il", "i...,j...->ij", "iik,jk->ij", "ik,jk->ijq"])
def test_einsum_rejects_unsupported_specs(spec):
  with pytest.raises(ValueError):
    fp4jax.einsum(spec, jnp.ones((4, 4)), jnp.ones((4, 4)), recipe="nvfp4_rtn")


def test_gradient_alignment_metrics():
  x, w, t = _normal(1, (32, 64)), _normal(2, (48, 64)), _normal(3, (32, 48))

  def loss(params, t, *, recipe, key=None):
    x, w = params
    return jnp.mean(jnp.square(fp4jax.dot_general(x, w, DN, recipe=recipe, key=key) - t))

  exact = fp4jax.metrics.gradient_alignment(loss, (x, w), t, recipe="bf16")
  assert float(exact["cosine"]) == pytest.approx(1.0, abs=1e-6) and float(exact["misalignment"]) == pytest.approx(
    0.0, abs=1e-6
  )
  rtn = jax.jit(lambda p, t: fp4jax.metrics.gradient_alignment(loss, p, t, recipe="nvfp4_rtn"))((x, w), t)
  assert 0.9 < float(rtn["cosine"]) < 1.0 and abs(float(rtn["misalignment"])) < 0.1


def test_every_operand_and_signs_draw_folds_its_own_key():
  """Each quantized operand of the three GEMMs and each signs draw gets an independent stream (module docstring):
  two operands drawing from one folded key would round with correlated bits, and E[Q(a)·Q(b)] would no longer be
  a·b."""
  from fp4jax._src import dot as dot_lib

  ids = list(dot_lib._KEY_IDS.values()) + list(dot_lib._SIGNS_IDS.values())
  assert sorted(dot_lib._KEY_IDS) == sorted(f"{g}_{s}" for g in ("fwd", "dgrad", "wgrad") for s in ("lhs", "rhs"))
  assert len(set(ids)) == len(ids) == 8


@pytest.mark.parametrize("backend", ["xla", "pallas"])
def test_random_operands_draw_with_the_documented_folded_keys(backend):
  """The module docstring's derivation: operand ``name`` rounds with ``fold_in(key, _KEY_IDS[name])`` (fwd_lhs 1,
  fwd_rhs 2, dgrad_lhs 3). The oracle quantizes each operand alone with that key (``fp4jax.fake_quantize``) and
  multiplies in float64; a wrong id or key gives other bits (stochastic rounding) and misses by far more than the
  float32 accumulation."""
  sr = OperandSpec(fmt=fp4jax.NVFP4, rounding="sr")
  r = Recipe("sr_three", fwd_lhs=sr, fwd_rhs=sr, dgrad_lhs=sr)
  x, w, dy = _normal(0, (64, 128)), _normal(1, (32, 128)), _normal(2, (64, 32))
  key = jax.random.key(5)
  y, vjp = jax.vjp(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=r, key=key, backend=backend), x, w)
  dx, _ = vjp(dy)
  q = lambda t, i: np.asarray(
    fp4jax.fake_quantize(t, fp4jax.QuantizeSpec(fp4jax.NVFP4, rounding="sr"), key=jax.random.fold_in(key, i)),
    np.float64,
  )
  qx, qw, qdy = q(x, 1), q(w, 2), q(dy, 3)
  np.testing.assert_allclose(np.asarray(y, np.float64), qx @ qw.T, rtol=1e-5, atol=1e-5 * np.abs(qx @ qw.T).max())
  ref_dx = qdy @ np.asarray(w, np.float64)  # dgrad_rhs: W as given (bf16 recipe slot)
  np.testing.assert_allclose(np.asarray(dx, np.float64), ref_dx, rtol=1e-5, atol=1e-5 * np.abs(ref_dx).max())
  other = q(x, 2) @ qw.T  # the same with fwd_lhs drawing fwd_rhs's key: a different result
  assert np.abs(other - qx @ qw.T).max() > 1e-3 * np.abs(qx @ qw.T).max()


def test_the_backward_draws_one_sign_vector_where_both_gemms_rotate_alike(jaxpr_equations):
  """dY's sign vectors for the data and the weight gradient come from one folded key (module docstring): quartet2's
  (both 128-point, random) are one draw in the backward pass, each draw a threefry call in a GPU's HLO; where the
  two rotate differently each is drawn at its own size. Draws counted per call site (a jitted function's equations
  once per call)."""
  x, w = jnp.ones((64, 256), jnp.bfloat16), jnp.ones((128, 256), jnp.bfloat16)

  def backward_draws(recipe):
    _, vjp = jax.vjp(lambda x, w: fp4jax.dot_general(x, w, DN, recipe=recipe, key=jax.random.key(0)), x, w)
    eqns = jaxpr_equations(jax.make_jaxpr(vjp)(jnp.ones((64, 128), jnp.bfloat16)).jaxpr)
    return sorted(e.params["shape"][0] for e in eqns if e.primitive.name == "random_bits")

  assert backward_draws("quartet2") == [2, 2, 2, 2, 128]  # four operands' seeds, one sign vector
  rotated = lambda d: OperandSpec(fmt=fp4jax.NVFP4, rounding="sr", hadamard=d, signs="random")  # noqa: E731
  mixed = Recipe(
    "signs_16_32", dgrad_lhs=rotated(16), dgrad_rhs=rotated(16), wgrad_lhs=rotated(32), wgrad_rhs=rotated(32)
  )
  assert backward_draws(mixed) == [2, 2, 2, 2, 16, 32]


def test_stochastic_forward_operands_of_one_tensor_round_independently():
  """dot_general(x, x) with stochastic rounding on both forward operands: Q1(x)·Q2(x)ᵀ is symmetric only if both
  drew the same bits (the same folded key)."""
  sr = OperandSpec(fmt=fp4jax.NVFP4, rounding="sr")
  r = Recipe("sr_fwd", fwd_lhs=sr, fwd_rhs=sr)
  x = jax.random.normal(jax.random.key(0), (32, 64))
  y = np.asarray(fp4jax.dot_general(x, x, DN, recipe=r, key=jax.random.key(1)))
  assert np.abs(y - y.T).max() > 1e-3 * np.abs(y).max()


def test_dimension_numbers_with_unequal_lhs_rhs_counts_are_rejected():
  x, w = jnp.ones((4, 8, 8)), jnp.ones((8, 3))
  with pytest.raises(ValueError, match="pair unequal numbers of lhs/rhs dims"):
    fp4jax.dot_general(x, w, (((1, 2), (0,)), ((), ())), recipe="nvfp4_rtn")
  with pytest.raises(ValueError, match="pair unequal numbers of lhs/rhs dims"):
    fp4jax.dot_general(jnp.ones((2, 4, 16)), jnp.ones((2, 8, 16)), (((2,), (2,)), ((0,), ())), recipe="nvfp4_rtn")


def test_dimension_numbers_accept_every_dim_from_minus_rank():
  """A dim d is valid for -rank <= d < rank (as lax.dot_general): -rank names dim 0; -rank - 1 and rank fail."""
  x = jax.random.normal(jax.random.key(2), (32, 6))
  w = jax.random.normal(jax.random.key(3), (16, 32))
  want = fp4jax.dot_general(x, w, (((0,), (1,)), ((), ())), recipe="nvfp4_rtn")
  np.testing.assert_array_equal(fp4jax.dot_general(x, w, (((-2,), (-1,)), ((), ())), recipe="nvfp4_rtn"), want)
  for bad in (-3, 2):
    with pytest.raises(ValueError, match=f"lhs dimension {bad} out of range for rank 2"):
      fp4jax.dot_general(x, w, (((bad,), (1,)), ((), ())), recipe="nvfp4_rtn")


@pytest.mark.parametrize(  # slow tier; default representatives: ms_fp4 (W re-quantized to FP8 for dgrad), nvidia_nvfp4
  "name",
  [n if n in ("ms_fp4", "nvidia_nvfp4") else pytest.param(n, marks=pytest.mark.slow) for n in recipes.names()],
)
def test_a_weight_closed_over_by_jit_gives_the_bits_of_a_weight_passed_in(name):
  """Parameters closed over by ``jax.jit`` are constants XLA may fold: the output and dX are those of the same W
  passed as an argument (ms_fp4's dgrad re-quantization of W was folded off the E4M3 grid on the CPU)."""
  d = 128
  w = (_normal(1, (d, d)) / 8).astype(jnp.bfloat16)
  x = _normal(2, (d, d)).astype(jnp.bfloat16)
  dn = (((1,), (0,)), ((), ()))

  def loss(x, w):
    y = fp4jax.dot_general(x, w, dn, recipe=name, key=KEY)
    return jnp.sum(jnp.square(y.astype(jnp.float32))), y

  passed = jax.jit(jax.grad(loss, has_aux=True))(x, w)
  closed = jax.jit(jax.grad(lambda x: loss(x, w), has_aux=True))(x)
  for a, b in zip(passed, closed):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
