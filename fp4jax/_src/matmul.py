"""``packed_matmul``: inference on packed FP4 weights (``fp4jax.QTensor``), through ``fp4jax.backends``' registry.

A weight packed by ``fp4jax.flax.pack`` (or ``fp4jax.quantize(w, fmt, axis=0, ...)``) is a QTensor of logical shape
(K, N) quantized along K. ``packed_matmul(x, w)`` multiplies activations by it without materializing a dequantized
copy where a kernel takes the case:

* ``x`` an array [..., K] (weight-only FP4, "W4A16"): ``x @ w.dequantize()``, the weight dequantized to fp32 in the
  original (unrotated) domain, one fp32-accumulated dot (``Precision.HIGHEST``). XLA only: the kernels read two FP4
  operands.
* ``x`` a QTensor [..., K] quantized along its last axis ("W4A4", e.g. ``fp4jax.quantize(x, w.fmt,
  hadamard=w.hadamard, hadamard_signs=...)``): ``dq(x) @ dq(w)`` computed in the operands' shared Hadamard domain
  (``dequantize(rotated=True)`` on both: ``(x̂H)(ŵH)ᵀ = x̂ŵᵀ`` since ``H`` is orthogonal, with the same sign
  vector). The kernels implement this case (``fp4jax_kernels.gemm.api``: native on Blackwell, the Pallas GEMV for a
  few rows and the tensor-core GEMM otherwise); each refuses (``backends.Unsupported``) what it cannot take and
  ``"auto"`` then falls back to XLA's reference. Every implementation sums the same exact products in fp32; the
  results differ by fp32 summation order only.

The XLA reference is the op's ``"xla"`` implementation (registered here); the kernels register theirs when
``fp4jax_kernels`` is imported. ``PACKED_MATMUL_OP``'s implementations take ``(x2, w, *, out_dtype, auto)`` with
``x2`` the activations folded to 2D (an array (M, K) or a QTensor (M, K) quantized along axis 1).

Inference only: there is no gradient with respect to a packed operand (its codes are integers; train the
high-precision weights and pack them): differentiating with respect to ``w``, or to a QTensor ``x``, raises
``ValueError``. The gradient with respect to an array ``x`` is ``g @ w.dequantize()ᵀ`` (the reference's).
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fp4jax._src import backends, checks
from fp4jax._src.backends import Backend
from fp4jax._src.quantize import QTensor

PACKED_MATMUL_OP = "packed_matmul"


def packed_matmul(x: jax.Array | QTensor, w: QTensor, *, out_dtype=None, backend: Backend = "auto") -> jax.Array:
  """``x @ dequantize(w)`` for a packed FP4 weight ``w`` (K, N); fp32 accumulation (see the module docstring).

  Args:
    x: activations [..., K]: a floating-point array, or a QTensor quantized along its last axis with ``w``'s
      Hadamard size and sign vector (the product is taken in that rotated domain).
    w: a 2-D QTensor of logical shape (K, N) quantized along axis 0 (K), as ``fp4jax.flax.pack`` stores a Dense /
      Linear kernel.
    out_dtype: the result's dtype; default ``x``'s dtype (a QTensor's original dtype).
    backend: ``"auto"`` (the kernels the device runs, then XLA), ``"xla"``, ``"pallas"`` or ``"native"``
      (``fp4jax.backends``; a named backend raises ``Unsupported`` where it does not take the case).

  Returns:
    [..., N] array of ``out_dtype``.

  Raises:
    TypeError: ``w`` not a QTensor; ``x`` neither a floating-point array nor a QTensor; ``out_dtype`` not a
      floating dtype; a QTensor's codes not uint8.
    ValueError: a QTensor's codes, scales, tensor scale or signs of another shape than its metadata implies; ``w``
      not 2-D or not quantized along axis 0; ``x``'s last axis not K; a QTensor ``x`` not quantized along its last
      axis, or with another Hadamard size (or, when both are concrete, sign vector) than ``w``;
      differentiation with respect to ``w`` or a QTensor ``x``.
  """
  backend = backends.check(backend, "fp4jax.packed_matmul")
  checks.floating_dtype("fp4jax.packed_matmul", "out_dtype", out_dtype)
  _check(x, w)
  lead = x.shape[:-1]
  out_dtype = jnp.dtype(out_dtype or x.dtype)
  y = _packed_matmul(_fold(x), w, out_dtype, backend)
  return y.reshape(*lead, w.shape[1])


def _check(x, w) -> None:
  """Trace-time checks of ``packed_matmul``'s operands (errors name the argument and the expected layout)."""
  if not isinstance(w, QTensor):
    raise TypeError(
      f"fp4jax.packed_matmul: w must be a QTensor (fp4jax.flax.pack / fp4jax.quantize of a (K, N) "
      f"weight), got {type(w).__name__}"
    )
  if len(w.shape) != 2 or w.axis != 0:
    raise ValueError(
      f"fp4jax.packed_matmul: w must be a 2-D (K, N) QTensor quantized along axis 0 (K), got shape "
      f"{w.shape} quantized along axis {w.axis}"
    )
  _check_arrays("w", w)
  k = w.shape[0]
  if isinstance(x, QTensor):
    _check_arrays("x", x)
    if len(x.shape) < 1 or x.axis != len(x.shape) - 1:
      raise ValueError(
        f"fp4jax.packed_matmul: a QTensor x must be quantized along its last axis (K), got shape "
        f"{x.shape} quantized along axis {x.axis}"
      )
    if x.hadamard != w.hadamard:
      raise ValueError(
        f"fp4jax.packed_matmul: x and w must share the Hadamard domain, got hadamard={x.hadamard} "
        f"for x and {w.hadamard} for w"
      )
    if x.hadamard and _differ(x.signs, w.signs):
      raise ValueError(
        "fp4jax.packed_matmul: x and w were rotated with different Hadamard sign vectors (quantize x "
        "with w's hadamard_signs)"
      )
  elif not (hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and jnp.ndim(x) >= 1):
    raise TypeError(
      f"fp4jax.packed_matmul: x must be a floating-point array [..., K] or a QTensor, got "
      f"{getattr(x, 'dtype', type(x).__name__)} of shape {jnp.shape(x)}"
    )
  if x.shape[-1] != k:
    raise ValueError(
      f"fp4jax.packed_matmul: x's last axis ({x.shape[-1]}, shape {tuple(x.shape)}) must be w's K "
      f"({k}, w of shape {w.shape})"
    )


def _check_arrays(name: str, q: QTensor) -> None:
  """``q``'s arrays have the shapes and dtypes its metadata implies (a QTensor built by hand or restored from a
  corrupted checkpoint would otherwise decode wrong values): uint8 codes of the logical shape with the quantized axis
  padded to whole blocks and halved, ``scale_shape`` scales, a scalar tensor scale, ``hadamard`` signs if any."""
  fn = f"fp4jax.packed_matmul: {name}"
  codes = list(q.shape)
  block = q.block_shape[-1]
  codes[q.axis] = -(-codes[q.axis] // block) * block // 2
  chex.assert_type(q.codes, jnp.uint8, exception_type=TypeError, custom_message=f"{fn}.codes must be uint8")
  for what, a, shape in (
    ("codes", q.codes, tuple(codes)),
    ("scales", q.scales, q._layout.scale_shape),
    ("global_scale", q.global_scale, ()),
    ("signs", q.signs, (q.hadamard,) if q.hadamard and q.signs is not None else None),
  ):
    if shape is not None:
      chex.assert_shape(
        a,
        shape,
        exception_type=ValueError,
        custom_message=f"{fn}.{what} of shape {jnp.shape(a)} does not fit a QTensor of shape {q.shape} quantized "
        f"along axis {q.axis} in {q.block_shape} blocks (expected {shape})",
      )


def _differ(a, b) -> bool:
  """Two sign vectors known (concrete, not traced) to differ; under ``jit`` the caller's contract."""
  if a is None or b is None or isinstance(a, jax.core.Tracer) or isinstance(b, jax.core.Tracer):
    return False
  return not np.array_equal(np.asarray(a), np.asarray(b))


def _fold(x):
  """``x`` [..., K] as 2-D rows (M, K): an array reshaped, a QTensor's codes and scales reshaped alike."""
  if not isinstance(x, QTensor):
    return x.reshape(-1, x.shape[-1])
  rows = int(np.prod(x.shape[:-1], dtype=np.int64))
  if len(x.block_shape) == 2 and len(x.shape) > 2 and x.shape[-2] % x.block_shape[0]:  # tiles must fold whole
    raise ValueError(
      f"fp4jax.packed_matmul: a QTensor x with {x.block_shape} tiles and leading dims needs "
      f"shape[-2] a multiple of {x.block_shape[0]}, got shape {x.shape}"
    )
  codes = x.codes.reshape(-1, x.codes.shape[-1])
  scales = x.scales.reshape(-1, x.scales.shape[-1])
  return QTensor(
    codes=codes,
    scales=scales,
    global_scale=x.global_scale,
    signs=x.signs,
    shape=(rows, x.shape[-1]),
    axis=1,
    fmt=x.fmt,
    block_shape=x.block_shape,
    hadamard=x.hadamard,
    dtype=x.dtype,
  )


def _is_zero(tangent) -> bool:
  return all(
    isinstance(t, jax.custom_derivatives.SymbolicZero)
    for t in jax.tree.leaves(tangent, is_leaf=lambda t: isinstance(t, jax.custom_derivatives.SymbolicZero))
  )


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _packed_matmul(x, w: QTensor, out_dtype, backend: Backend) -> jax.Array:
  return backends.run(PACKED_MATMUL_OP, backend, x, w, out_dtype=out_dtype, auto=backend == "auto")


def _packed_matmul_jvp(out_dtype, backend, primals, tangents):
  """Linear in an array ``x``'s tangent (``tx @ dq(w)``, the reference's); a packed operand has no derivative."""
  x, w = primals
  tx, tw = tangents
  if not _is_zero(tw) or (isinstance(x, QTensor) and not _is_zero(tx)):
    raise ValueError(
      "fp4jax.packed_matmul is inference only: it has no derivative with respect to a packed QTensor "
      "operand (integer codes). Train the high-precision weights (fp4jax.flax layers) and pack them "
      "for inference; differentiate only with respect to an array x"
    )
  y = _packed_matmul(x, w, out_dtype, backend)
  if _is_zero(tx):
    return y, jnp.zeros_like(y)
  return y, _xla(tx, w, out_dtype=out_dtype, auto=False)


_packed_matmul.defjvp(_packed_matmul_jvp, symbolic_zeros=True)


def _xla(x, w: QTensor, *, out_dtype, auto: bool) -> jax.Array:
  """``PACKED_MATMUL_OP``'s XLA reference: dequantize (fp32; both operands in the rotated domain when ``x`` is a
  QTensor, ``w`` unrotated otherwise), then one dot with fp32 accumulation at ``Precision.HIGHEST``."""
  del auto
  if isinstance(x, QTensor):
    a, b = x.dequantize(jnp.float32, rotated=True), w.dequantize(jnp.float32, rotated=True)
  else:
    a, b = x.astype(jnp.float32), w.dequantize(jnp.float32)
  return jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32).astype(out_dtype)


backends.register(PACKED_MATMUL_OP, "xla", _xla)
