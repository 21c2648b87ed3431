"""Hadamard transforms: the Sylvester definition, orthogonality, any axis, signs, errors, derivatives."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4jax._src import hadamard as H
from fp4jax._src.operand import rotate  # the XLA path of the GEMM operands
from tests import numpy_reference as ref
from tests import oracles

F32 = np.float32
U = 2.0**-24  # unit roundoff of float32 (round to nearest)
SQRT2_F32 = np.uint32(0x3FB504F3).view(F32)  # float32(sqrt 2), correctly rounded (sqrt 2 = 1.0110101000001001111...)


def _sizes(*default):
  """``sizes`` with all but ``default`` in the slow tier (each size compiles its own programs)."""
  slow = pytest.mark.slow  # slow tier; default representative: the sizes ``default`` (see each test's decorator)
  return [d if d in default else pytest.param(d, marks=slow) for d in H.SIZES]


@pytest.mark.parametrize("d", _sizes(16))  # default: d = 16 (TE's RHT)
def test_matches_matrix_definition_and_inverts(d):
  rng = np.random.RandomState(d)
  x = rng.randn(3, 2 * d).astype(np.float32)
  s = rng.choice([-1.0, 1.0], d).astype(np.float32)
  h = H.hadamard_matrix(d)
  np.testing.assert_allclose(h @ h.T, np.eye(d), atol=1e-6)
  expect = ((x.reshape(3, 2, d).astype(np.float64) * s) @ h).reshape(3, 2 * d)
  y = np.asarray(H.hadamard(x, d, signs=s))
  np.testing.assert_allclose(y, expect, rtol=0, atol=1e-5 * np.abs(x).max())
  np.testing.assert_allclose(np.asarray(H.inverse_hadamard(y, d, signs=s)), x, atol=1e-5 * np.abs(x).max())


@pytest.mark.parametrize(  # slow tier; default representative: [16]
  "d", [16, *(pytest.param(d, marks=pytest.mark.slow) for d in (32, 128))]
)
def test_fwht_of_parts_adds_the_same_floats_in_the_same_order(d):
  """``fwht_parts`` (the chunk as d arrays, as the kernels' strided loads hold it) gives ``fwht``'s bits on inputs
  spread over 60 binades, where any other summation order rounds differently somewhere."""
  key1, key2 = jax.random.split(jax.random.key(d))
  x = jax.random.normal(key1, (64, 3, d)) * jnp.exp2(jax.random.randint(key2, (64, 3, d), -30, 30).astype(jnp.float32))
  parts = H.fwht_parts([x[..., i] for i in range(d)])
  np.testing.assert_array_equal(np.stack(parts, axis=-1), np.asarray(H.fwht(x, d)))


@pytest.mark.parametrize("n_parts", [2, 4])
def test_fwht_of_vector_parts_then_within_each_part_is_fwht(n_parts):
  """A 32-point chunk as ``n_parts`` parts of contiguous elements (the kernels' vector parts): ``fwht_parts`` over
  the parts, then ``fwht`` within each, gives ``fwht``'s bits on data spread over 60 binades; a part count that is
  not a power of two is refused."""
  key1, key2 = jax.random.split(jax.random.key(n_parts))
  binades = jax.random.randint(key2, (64, 3, 32), -30, 30).astype(jnp.float32)
  x = jax.random.normal(key1, (64, 3, 32)) * jnp.exp2(binades)
  v = 32 // n_parts
  parts = H.fwht_parts([x[..., p * v : (p + 1) * v] for p in range(n_parts)])
  np.testing.assert_array_equal(np.concatenate([H.fwht(p, v) for p in parts], axis=-1), np.asarray(H.fwht(x, 32)))
  with pytest.raises(ValueError, match="power of two, got 3"):
    H.fwht_parts([x] * 3)


def test_sylvester_recursion():
  h4 = np.sign(H.hadamard_matrix(32))
  h2 = np.sign(H.hadamard_matrix(16))
  np.testing.assert_array_equal(h4, np.block([[h2, h2], [h2, -h2]]))


# slow tier; default representative: test_middle_axis_of_a_3d_array_against_the_numpy_rotation (chunks along another
# axis than the last, named positively and negatively, against the NumPy rotation)
@pytest.mark.slow
def test_along_other_axes_equals_transposed_call():
  x = np.random.RandomState(0).randn(64, 5, 3).astype(np.float32)
  a = np.asarray(H.hadamard(x, 32, axis=0))
  b = np.moveaxis(np.asarray(H.hadamard(np.moveaxis(x, 0, -1), 32)), -1, 0)
  np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("axis", [1, -2])
def test_middle_axis_of_a_3d_array_against_the_numpy_rotation(axis):
  """Chunks along a middle axis, named positively or negatively (NumPy oracle: float64 Sylvester products of small
  integers, exact, then the one float32 normalization)."""
  rng = np.random.RandomState(3)
  x = rng.randint(-8, 9, (3, 64, 5)).astype(np.float32)
  s = rng.choice([-1.0, 1.0], 32).astype(np.float32)
  expect = np.moveaxis(oracles.rotate_last(np.moveaxis(x, 1, -1), 32, s), -1, 1)
  np.testing.assert_array_equal(np.asarray(H.hadamard(x, 32, axis=axis, signs=s)), expect)


def test_inverse_runs_along_the_last_axis_by_default():
  rng = np.random.RandomState(4)
  g = rng.randint(-8, 9, (2, 3, 64)).astype(np.float32)
  s = rng.choice([-1.0, 1.0], 16).astype(np.float32)
  np.testing.assert_allclose(
    np.asarray(H.inverse_hadamard(g, 16, signs=s)), oracles.inverse_rotate_last(g, 16, s), rtol=0, atol=1e-6
  )


def test_te_signs_mask():
  bits = sum(1 << i for i, s in enumerate(H.TE_SIGNS_16) if s < 0)
  assert bits == 0xD7E8


def test_random_signs_are_pm1_and_keyed():
  a = np.asarray(H.random_signs(jax.random.key(0), 128))
  b = np.asarray(H.random_signs(jax.random.key(0), 128))
  c = np.asarray(H.random_signs(jax.random.key(1), 128))
  assert set(np.unique(a)) <= {-1.0, 1.0} and np.array_equal(a, b) and not np.array_equal(a, c)


def test_grad_and_vmap():
  x = jnp.asarray(np.random.RandomState(1).randn(4, 32), jnp.float32)
  g = jax.grad(lambda v: jnp.sum(H.hadamard(v, 32) ** 2))(x)  # orthogonal: d/dx ||Hx||² = 2x
  np.testing.assert_allclose(np.asarray(g), 2 * np.asarray(x), rtol=1e-5, atol=1e-5)
  v = jax.vmap(lambda r: H.hadamard(r, 16))(x)
  np.testing.assert_array_equal(np.asarray(v), np.asarray(H.hadamard(x, 16)))


@pytest.mark.parametrize(
  "call,match",
  [
    (lambda: H.hadamard(jnp.ones((4, 48)), 32), "must divide"),
    (lambda: H.hadamard(jnp.ones((4, 48)), 24), "Hadamard size"),
    (lambda: H.hadamard(jnp.ones((4, 32)), 32, signs=jnp.ones(16)), "signs"),
  ],
)
def test_errors(call, match):
  with pytest.raises(ValueError, match=match):
    call()


@pytest.mark.parametrize("d", _sizes(32))  # default: d = 32, where XLA merged the multiplies without the fence
def test_rotation_keeps_its_rounding_under_a_later_constant_multiply(d):
  """A jitted rotate-then-scale equals rotating and scaling in two jits: XLA must not merge 1/sqrt(d) with the 3/4
  (MXFP4 headroom) into one multiply. Without the fence in ``fp4jax.hadamard.rotated`` this fails for d = 32 and
  128 (on the CPU; the GPU's XLA made the same merge in quartet's operands: BENCHMARKS.md §5 at commit
  83b474b)."""
  x = jax.random.normal(jax.random.key(d), (64, 4 * d), jnp.float32)
  signs = H.random_signs(jax.random.key(1), d)
  fused = jax.jit(lambda a: rotate(a, d, signs) * jnp.float32(0.75))(x)
  staged = jax.jit(lambda y: y * jnp.float32(0.75))(jax.jit(lambda a: rotate(a, d, signs))(x))
  np.testing.assert_array_equal(np.asarray(fused).view(np.uint32), np.asarray(staged).view(np.uint32))


def _norm_f32(d):
  """float32(1/sqrt(d)) by hand: 2^-k for d = 4^k, float32(sqrt 2)·2^-(k+1) for d = 2·4^k (a power-of-two multiple
  of a correctly rounded float32 is correctly rounded)."""
  k = int(math.log2(d)) // 2
  return F32(2.0**-k) if d == 4**k else F32(float(SQRT2_F32) * 2.0 ** -(k + 1))


def _wht_bound(x, d, extra=0):
  """Float32 error bound of each output of a chunk's transform: the butterfly sums every ±x_i in a tree of depth
  L = log2 d (error <= γ_L·Σ|x_i|, Higham §4.2), and the normalization rounds once more on top of float32(1/sqrt(d))
  (relative u each): |ŷ - y| <= γ_n·Σ|x_i|/sqrt(d), n = L + 2 (+ ``extra`` roundings of the caller), broadcast over
  the chunk."""
  n = int(math.log2(d)) + 2 + extra
  gamma = n * U / (1 - n * U)
  return gamma * np.sum(np.abs(np.asarray(x, np.float64)), axis=-1, keepdims=True) / math.sqrt(d)


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize(  # slow tier; default representative: d = 32 and 128 (the hand-rounded float32(sqrt 2) norms)
  "d", [*(pytest.param(d, marks=pytest.mark.slow) for d in (16, 64)), 32, 128]
)
def test_direct_transform_equals_the_float64_oracle_and_scales_one_hots_exactly(d, inverse):
  """``_direct`` (the float32 branch every backend but the CPU runs; called here directly) on normal-range data:
  within the float32 error bound of the float64 ``(x ⊙ s) · H_d / sqrt(d)`` (inverse: ``(x · H_d / sqrt(d)) ⊙ s``),
  and bit-exact on one-hot chunks, whose outputs are ``±s·float32(1/sqrt(d))`` (±2^-k for d = 4^k, the hand-rounded
  float32(sqrt 2)·2^-(k+1) for d = 32, 128), Sylvester signs."""
  rng = np.random.default_rng(d + inverse)
  s = rng.choice([-1.0, 1.0], d).astype(F32)
  x = (rng.standard_normal((8, d)) * np.exp2(rng.integers(-40, 40, (8, 1)))).astype(F32)
  f = jax.jit(lambda a, t: H._direct(a, t, d=d, inverse=inverse))
  h = oracles.sylvester(d) / math.sqrt(d)
  x64 = x.astype(np.float64)
  want = (x64 @ h) * s if inverse else (x64 * s) @ h
  err = np.abs(np.asarray(f(x, s), np.float64) - want)
  assert np.all(err <= _wht_bound(x, d)), (err / _wht_bound(x, d)).max()
  got = np.asarray(f(np.eye(d, dtype=F32), s))
  signs = oracles.sylvester(d) * (s if inverse else s[:, None])  # row j: e_j's transform (s_j or s per column)
  np.testing.assert_array_equal(got, (signs * _norm_f32(d)).astype(F32))


@pytest.mark.parametrize("d", _sizes(32))  # default: d = 32, 1/sqrt(d) not a power of two
def test_direct_transform_keeps_its_rounding_under_a_later_constant_multiply(d):
  """Jitted ``_direct`` then ``· 3/4`` equals the two in separate jits: the optimization barrier stops XLA from
  merging f32(1/sqrt(d)) with the 3/4 where 1/sqrt(d) is not a power of two (d = 32, 128)."""
  x = jax.random.normal(jax.random.key(d), (64, 4, d), jnp.float32)
  s = H.random_signs(jax.random.key(1), d)
  direct = lambda a: H._direct(a, s, d=d, inverse=False)
  fused = jax.jit(lambda a: direct(a) * jnp.float32(0.75))(x)
  staged = jax.jit(lambda y: y * jnp.float32(0.75))(jax.jit(direct)(x))
  np.testing.assert_array_equal(np.asarray(fused).view(np.uint32), np.asarray(staged).view(np.uint32))


def _extreme_chunks(d):
  """Rows of one d-chunk each: constant chunks of ±(2 - 2^-23)·2^e for e from -149 to 127 (every butterfly sum of
  equal values is exact until it overflows: d = 256 constant chunks scaled to 2^120 would overflow), 1.0, a chunk
  with ±FLT_MAX and normal values (scaled by 2 it would be Inf), and all-subnormal chunks."""
  rng = np.random.default_rng(d)
  exps = [-149, -140, -127, -126, -100, -1, 0, 1, 60, 96, 97, 110, 118, 119, 120, 123, 124, 127]
  rows = [np.full(d, sign * (2 - 2.0**-23) * 2.0**e) for e in exps for sign in (1, -1)]
  rows.append(np.ones(d))
  for big in (np.finfo(F32).max, -np.finfo(F32).max, 2.0**127):
    row = rng.standard_normal(d) * 2.0**-100
    row[rng.integers(d)] = big
    rows.append(row)
  rows += [rng.choice([-1, 1], d) * rng.integers(1, 2**23, d) * 2.0**-149 for _ in range(2)]
  return np.stack(rows).astype(F32)  # (2 - 2^-23)·2^-149 rounds to 2^-148


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("d", _sizes(256))  # default: d = 256, whose constant chunks reach the headroom's bound
def test_extreme_exponent_chunks_equal_the_ieee_oracle(d, inverse):
  """``hadamard`` / ``inverse_hadamard`` bits (the CPU's 2^k-scaled path) equal NumPy's IEEE float32 butterfly with
  subnormals (``tests/numpy_reference.py``) on chunks at the bottom and the top of the float32 range: constant chunks
  (whose d = 256 sums reach the scaled headroom's bound 2^127), ±FLT_MAX beside normal values (never scaled up), and
  all-subnormal chunks; overflowing sums are ±Inf as IEEE."""
  x = _extreme_chunks(d)
  s = np.asarray(H.random_signs(jax.random.key(d), d))
  f = H.inverse_hadamard if inverse else H.hadamard
  got = np.asarray(jax.jit(lambda a, t: f(a, d, signs=t))(x, s))
  want = ref.hadamard_ieee(x, d, s, inverse)
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  assert np.all(np.isfinite(want[-5:-2])) and np.count_nonzero(want[-2:]) > d  # FLT_MAX rows finite, tiny not 0


def _transform_derivative_oracle(x, s, tx, ts, d, inverse):
  """float64 JVP of ``x ↦ (x ⊙ s)·H/sqrt(d)`` (inverse: ``(x·H/sqrt(d)) ⊙ s``) in (x, s): the transform is linear in
  each, so the tangent is ``(tx ⊙ s + x ⊙ ts)·H/sqrt(d)`` (inverse: ``(tx·H/sqrt(d)) ⊙ s + (x·H/sqrt(d)) ⊙ ts``)."""
  h = oracles.sylvester(d) / math.sqrt(d)
  x, s, tx, ts = (np.asarray(a, np.float64) for a in (x, s, tx, ts))
  return (tx @ h) * s + (x @ h) * ts if inverse else (tx * s + x * ts) @ h


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize(  # slow tier; default representative: d = 32 (1/sqrt(d) not a power of two)
  "d", [pytest.param(16, marks=pytest.mark.slow), 32, pytest.param(128, marks=pytest.mark.slow)]
)
def test_jvp_and_vjp_in_the_input_and_the_signs_equal_the_linear_oracle(d, inverse):
  """``jax.jvp`` of ``hadamard`` / ``inverse_hadamard`` in both ``x`` and ``signs`` (a tangent of the signs is any
  vector) equals the float64 oracle within the float32 error bound: forward, ``tx ⊙ s + x ⊙ ts`` rounds twice before
  the transform (γ_{L+4}·Σ(|tx| + |x ⊙ ts|)/sqrt(d)); inverse, ``T(tx) ⊙ s + T(x) ⊙ ts`` rounds the product and the
  sum after it (γ_{L+4}·(Σ|tx| + |ts|·Σ|x|)/sqrt(d)). ``jax.vjp`` (JAX's transpose of that linear map, a butterfly
  of the cotangent) equals the float64 transposes ``(ct·H/sqrt(d)) ⊙ s`` and ``Σ_chunks x ⊙ (ct·H/sqrt(d))``
  (inverse: ``(ct ⊙ s)·H/sqrt(d)`` and ``Σ_chunks (x·H/sqrt(d)) ⊙ ct``) within γ_{L+2}·Σ|ct|/sqrt(d) per
  element, and ``Σ_chunks |x|·γ_{L+7}·Σ|ct|/sqrt(d)`` for the signs (one product and a sum of 5 chunks more)."""
  rng = np.random.default_rng(3 * d + inverse)
  x, tx, ct = (rng.standard_normal((5, d)) for _ in range(3))
  s = rng.choice([-1.0, 1.0], d)
  ts = rng.standard_normal(d) * 3
  x, tx, ct, s, ts = (a.astype(F32).astype(np.float64) for a in (x, tx, ct, s, ts))
  f = lambda a, t: (H.inverse_hadamard if inverse else H.hadamard)(a, d, signs=t)
  _, t_out = jax.jvp(f, (x.astype(F32), s.astype(F32)), (tx.astype(F32), ts.astype(F32)))
  want = _transform_derivative_oracle(x, s, tx, ts, d, inverse)
  if inverse:
    bound = _wht_bound(tx, d, 2) + np.abs(ts) * _wht_bound(x, d, 2)
  else:
    bound = _wht_bound(np.abs(tx) + np.abs(x * ts), d, 2)
  err = np.abs(np.asarray(t_out, np.float64) - want)
  assert np.all(err <= bound), (err / bound).max()
  _, vjp = jax.vjp(f, x.astype(F32), s.astype(F32))
  ct_x, ct_s = (np.asarray(a, np.float64) for a in vjp(ct.astype(F32)))
  h = oracles.sylvester(d) / math.sqrt(d)
  want_x = (ct * s) @ h if inverse else (ct @ h) * s
  want_s = np.sum((x @ h) * ct if inverse else x * (ct @ h), axis=0)
  assert np.all(np.abs(ct_x - want_x) <= _wht_bound(ct, d))
  bound_s = (
    np.sum(np.abs(ct) * _wht_bound(x, d, 5), axis=0) if inverse else np.sum(np.abs(x) * _wht_bound(ct, d, 5), axis=0)
  )
  assert np.all(np.abs(ct_s - want_s) <= bound_s)


@pytest.mark.parametrize("bad", [2.0, 0.0, 0.5, np.nan])
def test_concrete_signs_other_than_plus_minus_one_are_refused(bad):
  """A sign vector is ±1 by contract (x·s = x/s exactly, and the 2^k chunk scaling has headroom only for that):
  a concrete vector holding anything else fails naming ``signs``; under jit the contract stands unchecked."""
  signs = np.ones(16, np.float32)
  signs[3] = bad
  x = jnp.ones((2, 16), jnp.float32)
  for fn in (H.hadamard, H.inverse_hadamard):
    with pytest.raises(ValueError, match=r"signs must be \+1 or -1"):
      fn(x, 16, signs=signs)
  ok = -np.ones(16, np.float32)
  np.testing.assert_array_equal(np.asarray(H.hadamard(x, 16, signs=ok)), -np.asarray(H.hadamard(x, 16)))
