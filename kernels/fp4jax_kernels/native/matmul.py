"""``dq(A)·dq(B)ᵀ`` through ``jax.nn.scaled_matmul`` (cuDNN block-scaled FP4 GEMM on Blackwell) with fp4jax operands.

Operands: E2M1 elements as ``float4_e2m1fn`` (our codes decoded to their exact grid values and converted — exact,
every value is on the grid), block scales as they are in the QTensor (``float8_e4m3fn`` for NVFP4, 16-blocks;
``float8_e8m0fnu`` for MXFP4, 32-blocks) in the natural (rows, K/block) layout that ``jax.nn.scaled_matmul`` takes
(XLA rearranges them into cuBLAS' 128x4 scale tiles for cuDNN); the tensor scales multiply the fp32 result (the
GEMM's alpha). On GPUs without native FP4, XLA runs ``scaled_matmul`` as dequantize-and-dot; on CPU it has no
lowering, so CPU tests check ``operands`` against the formula ``jax.nn.scaled_matmul`` documents and check that
the call lowers for CUDA. ``fp4jax.packed_matmul``'s ``"native"`` backend (``fp4jax_kernels.gemm.api``) calls it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fp4jax._src.formats import e2m1_decode
from fp4jax._src.quantize import QTensor


def elements(q: QTensor) -> jax.Array:
  """(rows, K) ``float4_e2m1fn`` elements of a 2D QTensor quantized along its last axis (K padded to blocks)."""
  c = q.codes
  codes = jnp.stack([c & 0xF, c >> 4], axis=-1).reshape(c.shape[0], 2 * c.shape[1])
  return e2m1_decode(codes).astype(jnp.float4_e2m1fn)


@functools.partial(jax.jit, static_argnames=("out_dtype",))
def matmul(a: QTensor, b: QTensor, *, out_dtype=jnp.bfloat16) -> jax.Array:
  """``dq(a) · dq(b)ᵀ`` via ``jax.nn.scaled_matmul``; a (M, K), b (N, K) quantized along K, same format."""
  for name, q in (("a", a), ("b", b)):
    if len(q.shape) != 2 or q.axis != 1 or len(q.block_shape) != 1:
      raise ValueError(f"{name} must be a 2D QTensor quantized along its last axis with 1D blocks")
  if a.fmt != b.fmt or a.codes.shape[1] != b.codes.shape[1]:
    raise ValueError("a and b must share the format and the (padded) K")
  return _finish(jax.nn.scaled_matmul(*operands(a, b), preferred_element_type=jnp.float32), a, b, out_dtype)


def operands(a: QTensor, b: QTensor):
  """``(lhs, rhs, lhs_scales, rhs_scales)`` with a batch dim of 1, as ``jax.nn.scaled_matmul`` takes them."""
  return elements(a)[None], elements(b)[None], a.scales[None], b.scales[None]


def _finish(out, a: QTensor, b: QTensor, out_dtype):
  """The (1, M, N) fp32 product times both tensor scales (alpha), cast to ``out_dtype``."""
  return (out[0] * (a.global_scale * b.global_scale)).astype(out_dtype)
