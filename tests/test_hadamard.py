"""Hadamard transforms: the Sylvester definition, orthogonality, any axis, signs, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4jax._src import hadamard as H
from fp4jax._src.operand import rotate  # the XLA path of the GEMM operands
from tests import oracles


@pytest.mark.parametrize("d", H.SIZES)
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


@pytest.mark.parametrize("d", [16, 32, 128])
def test_fwht_of_parts_adds_the_same_floats_in_the_same_order(d):
  """``fwht_parts`` (the chunk as d arrays, as the kernels' strided loads hold it) gives ``fwht``'s bits on inputs
  spread over 60 binades, where any other summation order rounds differently somewhere."""
  key1, key2 = jax.random.split(jax.random.key(d))
  x = jax.random.normal(key1, (64, 3, d)) * jnp.exp2(jax.random.randint(key2, (64, 3, d), -30, 30).astype(jnp.float32))
  parts = H.fwht_parts([x[..., i] for i in range(d)])
  np.testing.assert_array_equal(np.stack(parts, axis=-1), np.asarray(H.fwht(x, d)))


def test_sylvester_recursion():
  h4 = np.sign(H.hadamard_matrix(32))
  h2 = np.sign(H.hadamard_matrix(16))
  np.testing.assert_array_equal(h4, np.block([[h2, h2], [h2, -h2]]))


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


@pytest.mark.parametrize("d", H.SIZES)
def test_rotation_keeps_its_rounding_under_a_later_constant_multiply(d):
  """A jitted rotate-then-scale equals rotating and scaling in two jits: XLA must not merge 1/sqrt(d) with the 3/4
  (MXFP4 headroom) into one multiply. Without the fence in ``fp4jax.hadamard.rotated`` this fails for d = 32 and
  128 (on the CPU; the GPU's XLA made the same merge in quartet's operands, BENCHMARKS.md §5)."""
  x = jax.random.normal(jax.random.key(d), (64, 4 * d), jnp.float32)
  signs = H.random_signs(jax.random.key(1), d)
  fused = jax.jit(lambda a: rotate(a, d, signs) * jnp.float32(0.75))(x)
  staged = jax.jit(lambda y: y * jnp.float32(0.75))(jax.jit(lambda a: rotate(a, d, signs))(x))
  np.testing.assert_array_equal(np.asarray(fused).view(np.uint32), np.asarray(staged).view(np.uint32))
