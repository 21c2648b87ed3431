"""fp4jax.bits against a NumPy MurmurHash3 oracle: the documented hash bit for bit (every backend and the Pallas
kernels must draw exactly these bits, so a different bijection is a bug even if it looks random), and index_grid's
logical-index arithmetic and limits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4jax._src import bits

M32 = 0xFFFFFFFF


def _fmix32(h: int) -> int:
  """MurmurHash3's 32-bit finalizer (Appleby's reference smhasher code)."""
  h ^= h >> 16
  h = (h * 0x85EBCA6B) & M32
  h ^= h >> 13
  h = (h * 0xC2B2AE35) & M32
  return h ^ (h >> 16)


def _hash(s0: int, s1: int, i: int) -> int:
  """bits = fmix32(fmix32(i·0x9E3779B9 + s0) ^ s1), uint32 wrapping (the fp4jax.bits docstring)."""
  return _fmix32(_fmix32((i * 0x9E3779B9 + s0) & M32) ^ s1)


def test_fmix32_reference_values():
  assert _fmix32(0) == 0
  got = np.asarray(bits.fmix32(jnp.asarray([0, 1, 0xDEADBEEF, M32], jnp.uint32)))
  np.testing.assert_array_equal(got, [_fmix32(v) for v in (0, 1, 0xDEADBEEF, M32)])


@pytest.mark.parametrize("seed", [(0, 0), (1, 2), (0xFFFFFFFF, 0x12345678), (0x9E3779B9, 0xC2B2AE35)])
def test_hash_bits_equal_the_documented_hash(seed):
  rng = np.random.default_rng(seed[0] & 0xFFFF)
  idx = np.concatenate([np.arange(64), rng.integers(0, 2**32, 256), [2**32 - 1]]).astype(np.uint32)
  got = np.asarray(bits.hash_bits(jnp.asarray(seed, jnp.uint32), jnp.asarray(idx)))
  np.testing.assert_array_equal(got, [_hash(seed[0], seed[1], int(i)) for i in idx])


def test_random_bits_hash_the_row_major_logical_index():
  key = jax.random.key(3)
  s0, s1 = (int(v) for v in np.asarray(bits.seed_from_key(key)))
  got = np.asarray(bits.random_bits(key, (2, 3), origin=(1, 5), logical_shape=(4, 9)))
  want = [[_hash(s0, s1, (1 + r) * 9 + 5 + c) for c in range(3)] for r in range(2)]
  np.testing.assert_array_equal(got, want)


def test_index_grid_limits():
  """2^32 elements are addressable (indices 0 ... 2^32 − 1), one more is not; shapes must fit their logical one."""
  got = np.asarray(bits.index_grid((1, 2), origin=(2**16 - 1, 2**16 - 2), logical_shape=(2**16, 2**16)))
  np.testing.assert_array_equal(got, [[2**32 - 2, 2**32 - 1]])
  with pytest.raises(ValueError, match="2\\*\\*32"):
    bits.index_grid((1, 1), origin=(0, 0), logical_shape=(2**16, 2**16 + 1))
  with pytest.raises(ValueError, match="rank"):
    bits.index_grid((2, 2), origin=(0, 0), logical_shape=(4,))
  with pytest.raises(ValueError, match="hold"):
    bits.index_grid((2, 5), origin=(0, 0), logical_shape=(4, 4))
  with pytest.raises(ValueError, match="both"):
    bits.index_grid((2, 2), origin=(0, 0))


def test_uniform_from_bits_uses_the_top_24_bits():
  b = np.array([0, 0xFF, 0x100, 0xFFFFFFFF, 0x80000000], np.uint32)
  got = np.asarray(bits.uniform_from_bits(jnp.asarray(b)), np.float64)
  np.testing.assert_array_equal(got, (b.astype(np.int64) >> 8) * 2.0**-24)
