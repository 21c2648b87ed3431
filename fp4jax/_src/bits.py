"""Counter-based random bits: ``bits[i] = hash(seed, i)`` for the global element index ``i``.

The same function runs in pure JAX, in Pallas kernels (which have no in-kernel PRNG) and under any sharding,
so every backend and every layout draws the same bits for the same logical element. The hash is two keyed
rounds of MurmurHash3's 32-bit finalizer ``fmix32`` (a bijection with full avalanche):

    h = fmix32(i * 0x9E3779B9 + s0);  bits = fmix32(h ^ s1)

with the seed ``(s0, s1)`` drawn once from a JAX PRNG key. All arithmetic is uint32, wrapping.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_GOLDEN = 0x9E3779B9
MAX_ELEMENTS = 2**32


def fmix32(h: jnp.ndarray) -> jnp.ndarray:
  """MurmurHash3's 32-bit finalizer (a bijection with full avalanche), wrapping uint32 arithmetic.

  ``h ^= h >> 16; h *= 0x85EBCA6B; h ^= h >> 13; h *= 0xC2B2AE35; h ^= h >> 16``.

  Args:
    h: uint32 array, any shape.

  Returns:
    uint32 array of ``h``'s shape.
  """
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def hash_bits(seed: jnp.ndarray, index: jnp.ndarray) -> jnp.ndarray:
  """32 random bits per element: ``fmix32(fmix32(index · 0x9E3779B9 + seed[0]) ^ seed[1])``, uint32 wrapping.

  Args:
    seed: array of 2 values, cast to uint32 (``seed_from_key``).
    index: integer array of element indices, any shape, cast to uint32.

  Returns:
    uint32 array of ``index``'s shape.
  """
  seed = seed.astype(jnp.uint32)
  h = fmix32(index.astype(jnp.uint32) * jnp.uint32(_GOLDEN) + seed[0])
  return fmix32(h ^ seed[1])


def seed_from_key(key: jax.Array) -> jnp.ndarray:
  """The hash seed of a JAX PRNG key: ``jax.random.bits(key, (2,), uint32)``.

  Args:
    key: a JAX PRNG key (raw uint32 keys and typed keys both work).

  Returns:
    uint32 array of shape (2,).
  """
  return jax.random.bits(key, (2,), jnp.uint32)


def index_grid(shape: tuple[int, ...], origin=None, logical_shape: tuple[int, ...] | None = None) -> jnp.ndarray:
  """Row-major flat index of every element of ``shape`` as uint32 (``iota``, no host constant).

  ``origin`` / ``logical_shape`` (both or neither): the array is the slice of a logical tensor of static shape
  ``logical_shape`` whose element ``[0, ..., 0]`` sits at ``origin`` (one int per dim, may be traced, e.g.
  ``lax.axis_index(name) * local_size`` under ``shard_map``); the result is then the logical row-major index
  ``sum_d (origin[d] + i_d) * stride_d`` with the logical strides, so a shard draws the bits the whole tensor
  would draw at those elements. Defaults: origin 0, logical shape ``shape``.
  """
  shape = tuple(shape)
  if (origin is None) != (logical_shape is None):
    raise ValueError("index_grid: pass both origin and logical_shape, or neither")
  logical = shape if logical_shape is None else tuple(int(n) for n in logical_shape)
  if len(logical) != len(shape) or any(n > big for n, big in zip(shape, logical)):
    raise ValueError(f"logical_shape {logical} must have the rank of shape {shape} and hold it")
  size = int(np.prod(logical, dtype=np.int64))
  if size > MAX_ELEMENTS:
    raise ValueError(f"random bits address at most 2**32 elements per tensor, got shape {logical}")
  origin = (0,) * len(shape) if origin is None else tuple(origin)
  if len(origin) != len(shape):
    raise ValueError(f"origin {origin} must have one entry per dim of shape {shape}")
  idx = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for dim in reversed(range(len(shape))):
    pos = jax.lax.broadcasted_iota(jnp.uint32, shape, dim) + jnp.asarray(origin[dim]).astype(jnp.uint32)
    idx = idx + pos * jnp.uint32(stride)
    stride *= logical[dim]
  return idx


def random_bits(
  key: jax.Array, shape: tuple[int, ...], origin=None, logical_shape: tuple[int, ...] | None = None
) -> jnp.ndarray:
  """uint32 random bits for a tensor of ``shape``: ``hash_bits(seed_from_key(key), index)``.

  The index is the element's row-major index; with ``origin`` and ``logical_shape`` it is the element's index in the
  logical tensor (``index_grid``), so a shard draws the bits the whole tensor would draw there.

  Args:
    key: a JAX PRNG key.
    shape: the shape of the (local) array.
    origin: one int per dim (may be traced): where element ``[0, ..., 0]`` sits in the logical tensor; pass with
      ``logical_shape`` or not at all.
    logical_shape: static shape of the logical tensor, of ``shape``'s rank and holding it.

  Returns:
    uint32 array of shape ``shape``.

  Raises:
    ValueError: only one of ``origin`` / ``logical_shape`` given, a rank or size mismatch between them and
      ``shape``, or a logical tensor of more than 2^32 elements.
  """
  return hash_bits(seed_from_key(key), index_grid(shape, origin, logical_shape))


def uniform_from_bits(bits: jnp.ndarray) -> jnp.ndarray:
  """Uniform float32 in [0, 1) on a 2^-24 grid from the top 24 bits: ``(bits >> 8) · 2^-24`` (exact).

  Args:
    bits: uint32 array, any shape.

  Returns:
    float32 array of ``bits``' shape, values in [0, 1 - 2^-24].
  """
  return (bits >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)
