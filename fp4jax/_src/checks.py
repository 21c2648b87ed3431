"""Argument checks at the public boundary, as ``chex`` assertions that raise the library's error types.

Each helper names the public function (``fn``) and the argument, and raises ``TypeError`` (a wrong kind of value)
or ``ValueError`` (a wrong shape) instead of chex's ``AssertionError``, so callers catch the usual exceptions. They
read only static properties (dtype, shape), so they run at trace time under ``jit`` at no cost.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp


def floating(fn: str, **arrays: Any) -> None:
  """Every array in ``arrays`` (argument name -> array) has a floating-point dtype.

  Raises:
    TypeError: naming ``fn``, the first non-floating argument and its dtype.
  """
  for name, a in arrays.items():
    chex.assert_type(
      a, float, exception_type=TypeError, custom_message=f"{fn}: {name} must be a floating-point array, got {a.dtype}"
    )


def floating_dtype(fn: str, name: str, dtype: Any) -> None:
  """``dtype`` (an output dtype argument), when given, is a floating-point dtype.

  Raises:
    TypeError: naming ``fn`` and ``name``.
  """
  if dtype is None:
    return
  chex.assert_type(
    jax.ShapeDtypeStruct((), dtype),
    float,
    exception_type=TypeError,
    custom_message=f"{fn}: {name} must be a floating-point dtype, got {jnp.dtype(dtype)}",
  )


def prng_key(fn: str, key: Any) -> None:
  """``key``, when given, is one PRNG key: a typed key array of shape ``()`` (``jax.random.key``) or a raw uint32
  key vector (``jax.random.PRNGKey``); not a batch of keys, not an int.

  Raises:
    TypeError: ``key`` not a key (an int, a float array); ValueError: a batch of keys.
  """
  if key is None:
    return
  what = f"{fn}: key must be one PRNG key (jax.random.key(seed))"
  if not hasattr(key, "dtype") or not hasattr(key, "shape"):
    raise TypeError(f"{what}, got {type(key).__name__} {key!r}")
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    chex.assert_shape(
      key, (), exception_type=ValueError, custom_message=f"{what}, got a key array of shape {key.shape}"
    )
    return
  chex.assert_type(key, jnp.uint32, exception_type=TypeError, custom_message=f"{what}, got dtype {key.dtype}")
  chex.assert_rank(key, 1, exception_type=ValueError, custom_message=f"{what}, got raw key data of shape {key.shape}")
