"""Counter-based random bits: determinism, index addressing, uniformity."""

import jax
import jax.numpy as jnp
import numpy as np

from fp4jax._src import bits


def test_index_grid_is_row_major():
  np.testing.assert_array_equal(np.asarray(bits.index_grid((3, 4, 5))), np.arange(60, dtype=np.uint32).reshape(3, 4, 5))


def test_same_key_same_bits_and_slices_agree():
  """Bits depend on (seed, global index) only: a slice of the tensor's bits equals the bits at those indices."""
  key = jax.random.key(7)
  full = np.asarray(bits.random_bits(key, (8, 16)))
  np.testing.assert_array_equal(full, np.asarray(bits.random_bits(key, (8, 16))))
  seed = bits.seed_from_key(key)
  idx = jnp.arange(3 * 16, 5 * 16, dtype=jnp.uint32).reshape(2, 16)
  np.testing.assert_array_equal(np.asarray(bits.hash_bits(seed, idx)), full[3:5])
  assert not np.array_equal(full, np.asarray(bits.random_bits(jax.random.key(8), (8, 16))))


def test_uniformity_and_bit_balance():
  """2^16 draws: the uniform's mean and every bit's frequency within 5 standard errors of 1/2."""
  b = np.asarray(bits.random_bits(jax.random.key(0), (1 << 16,)))
  n = b.size
  u = np.asarray(bits.uniform_from_bits(jnp.asarray(b)), np.float64)
  assert 0 <= u.min() and u.max() < 1
  assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n)
  freq = ((b[:, None] >> np.arange(32, dtype=np.uint32)) & 1).mean(0)
  assert np.all(np.abs(freq - 0.5) < 5 * 0.5 / np.sqrt(n))
  # consecutive indices are uncorrelated
  assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 5 / np.sqrt(n)
