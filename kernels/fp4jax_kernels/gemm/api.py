"""User entry for the FP4 GEMM ``dq(a)·dq(b)ᵀ``: native (Blackwell), Pallas Triton, or XLA, per ``fp4jax.backends``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp4jax import backends
from fp4jax.quantize import QTensor
from fp4jax_kernels.gemm import gemv, pallas_triton, reference
from fp4jax_kernels.native import matmul as native


def pallas_matmul(a: QTensor, b: QTensor, *, out_dtype=jnp.bfloat16) -> jax.Array:
  """The Pallas GEMM for these operands: the CUDA-core GEMV (``gemv``) when either side has at most ``gemv.ROWS``
  rows and it applies, else the tensor-core kernel (``pallas_triton``)."""
  if a.shape[0] <= gemv.ROWS and gemv.supports(a, b):
    return gemv.matmul(a, b, out_dtype=out_dtype)
  if b.shape[0] <= gemv.ROWS and gemv.supports(b, a):
    return gemv.matmul(b, a, out_dtype=out_dtype).T
  return pallas_triton.matmul(a, b, out_dtype=out_dtype)


IMPLEMENTATIONS = {"xla": reference.matmul, "pallas": pallas_matmul, "native": native.matmul}


def matmul(a: QTensor, b: QTensor, *, out_dtype=jnp.bfloat16, backend: str = "auto") -> jax.Array:
  """``dq(a) · dq(b)ᵀ`` for 2D QTensors quantized along K; fp32 accumulation, ``out_dtype`` result."""
  name = backends.resolve(backend, backends.gemm_backend(a.shape[1], a.fmt.block_size))
  return IMPLEMENTATIONS[name](a, b, out_dtype=out_dtype)
