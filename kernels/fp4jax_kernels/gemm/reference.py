"""XLA reference of the FP4 GEMM: dequantize both operands with ``QTensor.dequantize`` (fp32), then one dot."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fp4jax._src.quantize import QTensor


@functools.partial(jax.jit, static_argnames=("out_dtype",))
def matmul(a: QTensor, b: QTensor, *, out_dtype=jnp.bfloat16) -> jax.Array:
  """``dq(a) · dq(b)ᵀ`` in the operands' (shared) Hadamard domain, fp32 accumulation."""
  da = a.dequantize(jnp.float32, rotated=True)
  db = b.dequantize(jnp.float32, rotated=True)
  return jnp.dot(da, db.T, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32).astype(out_dtype)
