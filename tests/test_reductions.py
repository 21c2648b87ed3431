"""fp4jax.reductions: the documented halving order, bit for bit, over any axes and over a leading axis."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4jax._src.reductions import leading_pairwise_sum, pairwise_sum


def _halving_numpy(x: np.ndarray) -> np.ndarray:
  """x[2i] + x[2i + 1] stage by stage along the last axis, in float32."""
  while x.shape[-1] > 1:
    x = (x[..., 0::2] + x[..., 1::2]).astype(np.float32)
  return x


def test_pairwise_sum_follows_the_halving_order_bit_for_bit():
  x = np.asarray(jax.random.normal(jax.random.key(0), (64, 3, 32)) * jnp.logspace(-3, 3, 32), np.float32)
  got = np.asarray(jax.jit(lambda v: pairwise_sum(v, (-1,)))(x))
  np.testing.assert_array_equal(got, _halving_numpy(x))
  moved = np.moveaxis(x, 0, -1)
  np.testing.assert_array_equal(
    np.asarray(pairwise_sum(jnp.asarray(x), (0,))), np.moveaxis(_halving_numpy(moved), -1, 0)
  )


def test_pairwise_sum_over_two_axes_and_bad_length():
  x = jnp.arange(2 * 4 * 3 * 8, dtype=jnp.float32).reshape(2, 4, 3, 8)
  got = pairwise_sum(x, (1, 3))
  assert got.shape == (2, 1, 3, 1)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.sum(x, axis=(1, 3), keepdims=True)))  # exact ints
  with pytest.raises(ValueError, match="power-of-two"):
    pairwise_sum(jnp.ones((3, 6)), (-1,))


def test_leading_pairwise_sum_is_the_same_tree_on_the_leading_axis():
  x = np.asarray(jax.random.normal(jax.random.key(1), (16, 5, 7)) * jnp.logspace(-4, 4, 16)[:, None, None], np.float32)
  got = np.asarray(jax.jit(leading_pairwise_sum)(x))
  np.testing.assert_array_equal(got, _halving_numpy(np.moveaxis(x, 0, -1))[..., 0])
  # 4 holders of 4 consecutive leaves each: their partial trees, then the tree over the partials, are the same sum
  partials = np.stack([np.asarray(leading_pairwise_sum(x[4 * i : 4 * i + 4])) for i in range(4)])
  np.testing.assert_array_equal(np.asarray(leading_pairwise_sum(partials)), got)
  np.testing.assert_array_equal(np.asarray(leading_pairwise_sum(x[:1])), x[0])
  with pytest.raises(ValueError, match="power-of-two leading length"):
    leading_pairwise_sum(jnp.ones((6, 2)))
