"""User entry for the FP4 GEMM ``dq(a)·dq(b)ᵀ``: native (Blackwell), Pallas Triton, or XLA, per ``fp4jax.backends``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp4jax import backends
from fp4jax.quantize import QTensor
from fp4jax_kernels.gemm import pallas_triton, reference
from fp4jax_kernels.native import matmul as native

IMPLEMENTATIONS = {"xla": reference.matmul, "pallas": pallas_triton.matmul, "native": native.matmul}


def matmul(a: QTensor, b: QTensor, *, out_dtype=jnp.bfloat16, backend: str = "auto") -> jax.Array:
  """``dq(a) · dq(b)ᵀ`` for 2D QTensors quantized along K; fp32 accumulation, ``out_dtype`` result."""
  (m, k), (n, _) = a.shape, b.shape
  name = backends.resolve(backend, backends.gemm_backend(m, n, k, a.fmt.block_size))
  return IMPLEMENTATIONS[name](a, b, out_dtype=out_dtype)
