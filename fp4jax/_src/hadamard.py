"""Blockwise (randomized) Hadamard transforms along any axis.

``H_d`` is the Sylvester Hadamard matrix (``H_1 = [1]``, ``H_2n = [[H_n, H_n], [H_n, -H_n]]``), normalized by
``1/sqrt(d)`` so it is orthogonal and symmetric. A randomized transform multiplies by a ±1 diagonal first:
``T = diag(s) · H_d / sqrt(d)``, applied to each contiguous ``d``-chunk along ``axis`` as a row vector,
``y = x_chunk · T``; its inverse is ``x_chunk = y · Tᵀ = (y · H_d / sqrt(d)) ⊙ s``.

The transform is computed with the fast Walsh-Hadamard butterfly (log2 d constant-geometry stages of
``a + b, a - b``, see ``fwht``) in float32 and one final scaling: elementwise, fusible, and summed in the same
order on every backend and in the kernels (a matmul would let CPU and GPU sum in different orders and round
differently). Outputs are float32; ``rotated`` adds the quantizers' rounding once to bf16 for bf16 inputs, as
Transformer Engine does for its RHT.

Specification (``hadamard`` and ``inverse_hadamard``): IEEE float32 with subnormals (gradual underflow), round to
nearest, ties to even: ``x ⊙ s`` (exact), each butterfly ``a ± b`` rounded once, then ``· f32(1/sqrt(d))`` rounded
once (the inverse: ``· f32(1/sqrt(d))`` rounded once, then ``⊙ s``), Inf and NaN propagating as in IEEE (an
overflowing sum is Inf, Inf - Inf NaN). This is what a GPU computes natively; XLA on CPU flushes subnormal operands
and results to zero, so on the CPU each d-chunk is first scaled by
``2^k``, ``k = max(119 - floor(log2 max|chunk|), 0)`` (exact, on the float bits: ``fp4jax.ieee.mul_pow2_rn``), so
the chunk's max lies in [2^119, 2^120) and every butterfly sum below 2^127 (no overflow), while every nonzero value,
a multiple of 2^(k-149), is at least 2^-126 when k >= 23 (no subnormal): each scaled sum is then exactly ``2^k``
times the IEEE sum (a sum of float32 values that is subnormal is exact, and a normal one rounds at the same
relative position). The normalization and the ``2^-k`` are one rounding of the exact product
(``fp4jax.ieee.mul_rn``). k < 23 only for chunks with max|x| >= 2^97: those are computed unscaled, and a flushing
backend may there drop contributions below 2^-126 (they change a result only where the chunk's large values cancel
exactly).

Transformer Engine's NVFP4 recipe uses d = 16 with the fixed signs ``TE_SIGNS_16`` (mask 0xD7E8, LSB first
negated = 0), i.e. ``T = diag(TE_SIGNS_16) · H16 · 0.25``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4jax._src.formats import floor_log2
from fp4jax._src.ieee import mul_pow2_rn, mul_rn, widen
from fp4jax._src.rounding import rtn_bf16

SIZES = (16, 32, 64, 128, 256)
TE_SIGNS_16 = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)


def check_size(d: int, name: str = "d") -> None:
  if d not in SIZES:
    raise ValueError(f"Hadamard size {name} must be one of {SIZES}, got {d!r}")


def hadamard_matrix(d: int) -> np.ndarray:
  """The normalized Sylvester Hadamard matrix ``H_d / sqrt(d)`` (float32 numpy, for tests and kernels).

  Args:
    d: the size, one of ``SIZES``.

  Returns:
    float32 numpy array of shape (d, d), orthogonal and symmetric, entries ±1/sqrt(d).

  Raises:
    ValueError: ``d`` not in ``SIZES``.
  """
  check_size(d)
  h = np.ones((1, 1), np.float32)
  while h.shape[0] < d:
    h = np.block([[h, h], [h, -h]])
  return (h / np.sqrt(d)).astype(np.float32)


def random_signs(key: jax.Array, d: int) -> jnp.ndarray:
  """A vector of ``d`` independent uniform ±1 signs (float32) from ``key``.

  Args:
    key: a JAX PRNG key.
    d: the length, one of ``SIZES``.

  Returns:
    float32 array of shape (d,) with entries +1 or -1.

  Raises:
    ValueError: ``d`` not in ``SIZES``.
  """
  check_size(d)
  # jax.random.rademacher with a float32 probability: its Python 0.5 draws float64 uniforms under jax_enable_x64
  return jax.random.bernoulli(key, np.float32(0.5), (d,)).astype(jnp.float32) * 2 - 1


def fwht(x: jnp.ndarray, d: int) -> jnp.ndarray:
  """Unnormalized Walsh-Hadamard transform ``x · H_d`` of the last axis (length ``d``), Sylvester order.

  Constant-geometry butterflies: log2(d) identical stages, each pairing ``x[i]`` with ``x[i + d/2]`` and writing
  ``(a + b, a - b)`` to positions ``(2i, 2i + 1)``; after the last stage the result is in Sylvester order. Every
  stage has the same shape, so the Pallas kernels run this very function (split of a size-2 axis and a stack,
  which Triton lowers, no slicing) and add the same floats in the same order as XLA.

  Args:
    x: array whose last axis has length ``d``; computed in ``x``'s dtype.
    d: a power of two, the length of ``x``'s last axis (not checked against ``SIZES``).

  Returns:
    Array of ``x``'s shape and dtype.
  """
  lead = x.shape[:-1]
  for _ in range(int(math.log2(d))):
    a, b = jnp.split(x.reshape(*lead, 2, d // 2), 2, axis=-2)
    a, b = a.reshape(*lead, d // 2), b.reshape(*lead, d // 2)
    x = jnp.stack([a + b, a - b], axis=-1).reshape(*lead, d)
  return x


def fwht_parts(parts: list[jnp.ndarray]) -> list[jnp.ndarray]:
  """``fwht`` of chunks held as ``d`` arrays, ``parts[i]`` being element ``i`` of every chunk: the same stages,
  each pairing part ``i`` with part ``i + d/2`` into parts ``(2i, 2i + 1)``, so the same floats are added in the
  same order. Every stage is elementwise between whole arrays: a kernel that loads the parts with one layout
  (strided rows of a tile) rotates without moving data between threads. ``d`` is any power of two: with parts of
  several contiguous elements each (``fp4jax_kernels.quantize.pallas_triton.rotate_vector_parts``) these are a
  chunk's first stages, over its index's high bits, and ``fwht`` within each part completes it.

  Raises:
    ValueError: ``len(parts)`` is not a power of two."""
  d = len(parts)
  if d < 1 or d & (d - 1):
    raise ValueError(f"fwht_parts: the number of parts must be a power of two, got {d}")
  for _ in range(int(math.log2(d))):
    pairs = zip(parts[: d // 2], parts[d // 2 :])
    parts = [y for a, b in pairs for y in (a + b, a - b)]
  return parts


def _chunked(x: jnp.ndarray, d: int, axis: int):
  axis = axis % x.ndim
  n = x.shape[axis]
  if n % d:
    raise ValueError(f"Hadamard size {d} must divide the length {n} of axis {axis} (shape {x.shape})")
  moved = jnp.moveaxis(x, axis, -1)
  return moved.reshape(*moved.shape[:-1], n // d, d), moved.shape, axis


def hadamard(x: jnp.ndarray, d: int, *, axis: int = -1, signs: jnp.ndarray | np.ndarray | None = None) -> jnp.ndarray:
  """``y = x_chunk · diag(signs) · H_d / sqrt(d)`` for every ``d``-chunk along ``axis``; float32 result.

  Rounding as the module docstring specifies (IEEE float32, round to nearest even, each butterfly sum and the
  normalization rounded once).

  Args:
    x: any float array whose ``axis`` length is a multiple of ``d``.
    d: transform size, one of ``SIZES``.
    axis: the axis the chunks run along.
    signs: optional ±1 vector of length ``d`` (``random_signs`` or ``TE_SIGNS_16``); None means all +1.

  Returns:
    float32 array of ``x``'s shape.

  Raises:
    ValueError: ``d`` not in ``SIZES``, ``d`` does not divide the length of ``axis``, or ``signs`` is not of shape
      (d,).
  """
  check_size(d)
  chunks, moved_shape, axis = _chunked(widen(x), d, axis)
  y = _transform(chunks, _signs_or_ones(signs, d), d, False)
  return jnp.moveaxis(y.reshape(moved_shape), -1, axis)


def rotated(x: jnp.ndarray, d: int, *, axis: int = -1, signs: jnp.ndarray | np.ndarray | None = None) -> jnp.ndarray:
  """``hadamard(x, d, axis=axis, signs=signs)`` rounded as the quantizers specify.

  Once to bf16 for bf16 inputs (``rtn_bf16``, as TE), else the float32 result.

  XLA never merges the normalization with a later constant multiply (e.g. 1/sqrt(32) with MXFP4's 3/4 headroom),
  which would skip its rounding: it is integer arithmetic on the CPU and sits behind an optimization barrier
  elsewhere.

  Args:
    x: any float array whose ``axis`` length is a multiple of ``d``.
    d: transform size, one of ``SIZES``.
    axis: the axis the chunks run along.
    signs: optional ±1 vector of length ``d``; None means all +1.

  Returns:
    float32 array of ``x``'s shape (values on the bf16 grid when ``x`` is bfloat16).

  Raises:
    ValueError: as ``hadamard``.
  """
  y = hadamard(x, d, axis=axis, signs=signs)
  return rtn_bf16(y) if x.dtype == jnp.bfloat16 else y


def inverse_hadamard(
  y: jnp.ndarray, d: int, *, axis: int = -1, signs: jnp.ndarray | np.ndarray | None = None
) -> jnp.ndarray:
  """Inverse (= transpose) of ``hadamard``: ``x_chunk = (y_chunk · H_d / sqrt(d)) ⊙ signs``; float32 result.

  Args:
    y: any float array whose ``axis`` length is a multiple of ``d``.
    d: transform size, one of ``SIZES``.
    axis: the axis the chunks run along.
    signs: the ±1 vector of length ``d`` the forward transform used; None means all +1.

  Returns:
    float32 array of ``y``'s shape.

  Raises:
    ValueError: ``d`` not in ``SIZES``, ``d`` does not divide the length of ``axis``, or ``signs`` is not of shape
      (d,).
  """
  check_size(d)
  chunks, moved_shape, axis = _chunked(widen(y), d, axis)
  x = _transform(chunks, _signs_or_ones(signs, d), d, True)
  return jnp.moveaxis(x.reshape(moved_shape), -1, axis)


def _signs_or_ones(signs, d: int) -> jnp.ndarray:
  if signs is None:
    return jnp.ones((d,), jnp.float32)
  signs = jnp.asarray(signs, jnp.float32)
  if signs.shape != (d,):
    raise ValueError(f"signs must have shape ({d},) for a size-{d} Hadamard transform, got {signs.shape}")
  try:
    concrete = np.asarray(signs)
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):  # traced: the contract
    return signs
  if not np.all(np.abs(concrete) == 1):
    raise ValueError(f"signs must be +1 or -1 (a random sign flip per point), got values {np.unique(concrete)[:8]}")
  return signs


_HEADROOM = 119  # a chunk's max is scaled into [2^119, 2^120): d <= 256 sums stay below 2^127


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _transform(chunks: jnp.ndarray, signs: jnp.ndarray, d: int, inverse: bool) -> jnp.ndarray:
  """The module docstring's IEEE transform of the last axis: ``(x ⊙ s) · H_d / sqrt(d)`` or, ``inverse``,
  ``(x · H_d / sqrt(d)) ⊙ s``: by exact ``2^k`` scaling on the CPU, whose XLA flushes subnormals, and directly in
  float32 elsewhere (a GPU computes IEEE float32 with subnormals natively)."""
  return lax.platform_dependent(
    chunks,
    signs,
    cpu=functools.partial(_scaled, d=d, inverse=inverse),
    default=functools.partial(_direct, d=d, inverse=inverse),
  )


def _scaled(chunks: jnp.ndarray, signs: jnp.ndarray, *, d: int, inverse: bool) -> jnp.ndarray:
  """The transform with every chunk scaled by an exact ``2^k`` first, so no intermediate is subnormal (the signs
  multiply normal scaled values: exact, and a sign commutes with the final rounding)."""
  amax_bits = jnp.max(lax.bitcast_convert_type(chunks, jnp.int32) & 0x7FFFFFFF, axis=-1, keepdims=True)
  k = jnp.maximum(_HEADROOM - floor_log2(lax.bitcast_convert_type(amax_bits, jnp.float32)), 0)
  scaled = mul_pow2_rn(chunks, k)
  if inverse:
    summed = fwht(scaled, d) * signs
  else:
    summed = fwht(scaled * signs, d)
  return mul_rn(summed, jnp.float32(1.0 / math.sqrt(d)), -k)


def _direct(chunks: jnp.ndarray, signs: jnp.ndarray, *, d: int, inverse: bool) -> jnp.ndarray:
  """The transform in float32 arithmetic. For d = 32, 128 ``1/sqrt(d)`` is not a power of two: it passes through an
  ``optimization_barrier`` (a scalar), so XLA sees no constant to merge with a later constant multiply, which would
  skip the normalization's rounding; the product itself still fuses with its neighbours."""
  norm = jnp.float32(1.0 / math.sqrt(d))
  if d in (32, 128):
    norm = lax.optimization_barrier(norm)
  y = fwht(chunks if inverse else chunks * signs, d) * norm
  return y * signs if inverse else y


@_transform.defjvp
def _transform_jvp(d, inverse, primals, tangents):
  """Tangents by the plain float32 transform (linear, so JAX can transpose it for ``grad``)."""
  (chunks, signs), (t_chunks, t_signs) = primals, tangents
  plain = lambda a: fwht(a, d) * jnp.float32(1.0 / math.sqrt(d))
  if inverse:  # T(x) ⊙ s
    t_out = plain(t_chunks) * signs + plain(chunks) * t_signs
  else:  # T(x ⊙ s)
    t_out = plain(t_chunks * signs + chunks * t_signs)
  return _transform(chunks, signs, d, inverse), t_out
