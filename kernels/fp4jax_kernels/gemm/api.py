"""The FP4 GEMM kernels as implementations of ``fp4jax.matmul.PACKED_MATMUL_OP`` (``fp4jax.packed_matmul``).

``register`` (called by ``import fp4jax_kernels``) puts ``pallas_matmul`` as its ``"pallas"`` implementation and
``native_matmul`` as its ``"native"`` one in ``fp4jax.backends``' registry. Both take the W4A4 case only: the
activations a QTensor (M, K) quantized along K, the weight the packed (K, N) QTensor; both in one format and Hadamard
domain. Each refuses (``fp4jax.backends.Unsupported``, before tracing anything) an array ``x`` (weight-only FP4:
XLA's reference) and, under ``"auto"``, K not a whole number of blocks; ``"auto"`` then falls back to XLA.

The kernels read both operands K-major, (rows, K) with 1-D blocks along K (``k_major``): the packed weight's codes
and scales are transposed by XLA (an exact copy of K·N/2 + K·N/16 bytes per call) and NVIDIA's 16x16 weight tiles
become 1x16 blocks by repeating each tile's scale over its 16 rows (exact: the same scale multiplies the same
elements).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp4jax._src import backends
from fp4jax._src.matmul import PACKED_MATMUL_OP
from fp4jax._src.quantize import QTensor
from fp4jax_kernels.gemm import gemv, pallas_triton
from fp4jax_kernels.native import matmul as native


def k_major(q: QTensor) -> QTensor:
  """``q`` as the kernels read it: a 2-D QTensor (rows, K) quantized along axis 1 with 1-D blocks of
  ``q.fmt.block_size``; from (M, K) along axis 1 or (K, N) along axis 0 (transposed), 1-D blocks or 16x16 tiles
  (each tile's scale repeated over its rows). Exact: the same codes and scales, laid out again."""
  codes, scales = (q.codes, q.scales) if q.axis == 1 else (q.codes.T, q.scales.T)
  rows, k = q.shape if q.axis == 1 else q.shape[::-1]
  if len(q.block_shape) == 2:
    scales = jnp.repeat(scales, q.block_shape[0], axis=0)[:rows]
  return QTensor(
    codes=codes,
    scales=scales,
    global_scale=q.global_scale,
    signs=q.signs,
    shape=(rows, k),
    axis=1,
    fmt=q.fmt,
    block_shape=(q.fmt.block_size,),
    hadamard=q.hadamard,
    dtype=q.dtype,
  )


def operands(x, w: QTensor, auto: bool) -> tuple[QTensor, QTensor]:
  """(A (M, K), B (N, K)), both ``k_major``, for ``dq(A)·dq(B)ᵀ = dq(x)·dq(w)``; ``Unsupported`` for an array ``x``,
  operands of two formats, a block size other than the format's ``native_block_size``, or (under ``auto``) K not
  a whole number of blocks."""
  if not isinstance(x, QTensor):
    raise backends.Unsupported(
      "x is not quantized: the FP4 GEMM kernels multiply two FP4 operands (a weight-only product is XLA's)"
    )
  if x.fmt != w.fmt:
    raise backends.Unsupported(f"x is {x.fmt.name} and w {w.fmt.name}: the kernels take one format")
  if w.fmt.block_size != w.fmt.native_block_size:  # the block size the GEMMs decode (and the hardware reads)
    raise backends.Unsupported(
      f"{w.fmt.name} with {w.fmt.block_size}-element blocks: the kernels take "
      f"{w.fmt.native_block_size}-element blocks for {w.fmt.name}"
    )
  k, block = w.shape[0], w.fmt.block_size
  if auto and k % block:
    raise backends.Unsupported(f"K={k} is not a whole number of {block}-element blocks")
  return k_major(x), k_major(w)


def pallas_matmul(x, w: QTensor, *, out_dtype, auto: bool) -> jax.Array:
  """The ``"pallas"`` implementation: the CUDA-core GEMV (``gemv``) for at most ``gemv.ROWS`` rows of activations
  when it applies (NVFP4), else the tensor-core kernel (``pallas_triton``); Pallas interpret mode off a GPU."""
  a, b = operands(x, w, auto)
  interpret = backends.pallas_interpret()
  if a.shape[0] <= gemv.ROWS and gemv.supports(a, b):
    return gemv.matmul(a, b, out_dtype=out_dtype, interpret=interpret)
  return pallas_triton.matmul(a, b, out_dtype=out_dtype, interpret=interpret)


def native_matmul(x, w: QTensor, *, out_dtype, auto: bool) -> jax.Array:
  """The ``"native"`` implementation: ``jax.nn.scaled_matmul`` (block-scaled FP4 tensor cores, Blackwell)."""
  a, b = operands(x, w, auto)
  return native.matmul(a, b, out_dtype=out_dtype)


def register() -> None:
  """Register these as the ``"pallas"`` and ``"native"`` implementations of ``PACKED_MATMUL_OP``."""
  backends.register(PACKED_MATMUL_OP, "pallas", pallas_matmul)
  backends.register(PACKED_MATMUL_OP, "native", native_matmul)
