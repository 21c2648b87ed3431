"""User entry for the FP4 GEMM ``dq(a)·dq(b)ᵀ``: native (Blackwell), Pallas Triton, or XLA, through
``fp4jax.backends``' registry (op ``MATMUL_OP``, registered when this module is imported).

``"auto"`` tries what the device runs, fastest first (``fp4jax.backends.candidates``: native from compute
capability 10.0, Pallas from 8.0, then XLA); the native and Pallas GEMMs take K a whole number of blocks (under
``"auto"``; a named backend runs its GEMM as asked), whatever the rows (one row too: the Pallas GEMV beats XLA's
dequantize + dot there, BENCHMARKS.md §5).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp4jax import backends
from fp4jax.backends import Backend
from fp4jax.quantize import QTensor
from fp4jax_kernels.gemm import gemv, pallas_triton, reference
from fp4jax_kernels.native import matmul as native

MATMUL_OP = "fp4jax_kernels.matmul"


def pallas_matmul(a: QTensor, b: QTensor, *, out_dtype=jnp.bfloat16) -> jax.Array:
  """The Pallas GEMM for these operands: the CUDA-core GEMV (``gemv``) when either side has at most ``gemv.ROWS``
  rows and it applies, else the tensor-core kernel (``pallas_triton``)."""
  if a.shape[0] <= gemv.ROWS and gemv.supports(a, b):
    return gemv.matmul(a, b, out_dtype=out_dtype)
  if b.shape[0] <= gemv.ROWS and gemv.supports(b, a):
    return gemv.matmul(b, a, out_dtype=out_dtype).T
  return pallas_triton.matmul(a, b, out_dtype=out_dtype)


def matmul(a: QTensor, b: QTensor, *, out_dtype=jnp.bfloat16, backend: Backend = "auto") -> jax.Array:
  """``dq(a) · dq(b)ᵀ`` for 2D QTensors quantized along K; fp32 accumulation, ``out_dtype`` result."""
  backend = backends.check(backend, "fp4jax_kernels.gemm.api.matmul")
  return backends.run(MATMUL_OP, backend, a, b, out_dtype=out_dtype, auto=backend == "auto")


def whole_blocks(a: QTensor) -> None:
  """``Unsupported`` unless K is a whole number of ``a``'s blocks (the kernels' GEMMs read no partial block)."""
  k, block = a.shape[1], a.fmt.block_size
  if k % block:
    raise backends.Unsupported(f"K={k} is not a whole number of {block}-element blocks")


def _on_blocks(gemm):
  """``gemm`` as an implementation of ``MATMUL_OP``: under ``"auto"``, for whole blocks only."""
  def impl(a: QTensor, b: QTensor, *, out_dtype, auto: bool) -> jax.Array:
    if auto:
      whole_blocks(a)
    return gemm(a, b, out_dtype=out_dtype)
  return impl


def _reference(a: QTensor, b: QTensor, *, out_dtype, auto: bool) -> jax.Array:
  del auto
  return reference.matmul(a, b, out_dtype=out_dtype)


backends.register(MATMUL_OP, "xla", _reference)
backends.register(MATMUL_OP, "pallas", _on_blocks(pallas_matmul))
backends.register(MATMUL_OP, "native", _on_blocks(native.matmul))
