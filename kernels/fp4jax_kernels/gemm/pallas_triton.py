"""Dequantize-in-kernel FP4 GEMM, Pallas on the Triton backend: ``out = dq(A) · dq(B)ᵀ``.

A (M, K) and B (N, K) are ``fp4jax.QTensor`` s quantized along K (1D blocks; NVFP4 or MXFP4, either Hadamard domain
as long as both share it). Each program owns a (bm, bn) output tile and walks K in chunks of bk: it reads bk/2 code
bytes and bk/block scale bytes per row of each operand, rebuilds ``value(q) · scale_b`` in bf16 (exact: at most
2 + 4 significant bits, no rounding) and feeds the tensor cores (``dot_general``, bf16 operands, fp32 accumulate).
The nibbles are never interleaved back into K order: a byte holds elements 2j (low) and 2j + 1 (high), and
``Σ_k a_k b_k = Σ_j a_2j b_2j + Σ_j a_2j+1 b_2j+1``, so each chunk is two dots, of the low and of the high nibbles
(each element of the half-width arrays takes the scale of block ``j // (block/2)``).
The tensor scales multiply the fp32 accumulator once in the epilogue (as the hardware's alpha), so the result
differs from the XLA path (dequantize to fp32, then dot) only by fp32 summation order.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from fp4jax.formats import E4M3_NAN_BITS, E8M0_NAN_BITS
from fp4jax.quantize import QTensor
from fp4jax_kernels.edge_blocks import store_in_bounds


def e2m1_to_bf16(codes: jax.Array) -> jax.Array:
  """bf16 value of uint8 E2M1 codes by building the bf16 bit pattern (integer ops only, exact).

  Code ``s ee m``: ``e > 0`` -> ``(-1)^s · 2^(e-1) · (1 + m/2)`` = bits ``s<<15 | (e + 126)<<7 | m<<6``;
  ``e == 0`` -> ``(-1)^s · m/2`` = bits ``s<<15 | m·(126<<7)``.
  """
  c = codes.astype(jnp.int32)
  e, m, s = (c >> 1) & 3, c & 1, (c >> 3) & 1
  mag = jnp.where(e > 0, ((e + 126) << 7) | (m << 6), m * (126 << 7))
  return lax.bitcast_convert_type((mag | (s << 15)).astype(jnp.uint16), jnp.bfloat16)


def scale_to_f32(bits: jax.Array, fmt_name: str) -> jax.Array:
  """fp32 value of uint8 block-scale bits: E4M3 (``float8_e4m3fn``) or E8M0 (``2^(b-127)``); NaN patterns -> NaN."""
  b = bits.astype(jnp.int32)
  if fmt_name == "mxfp4":
    val = lax.bitcast_convert_type((jnp.maximum(b, 1) << 23).astype(jnp.uint32), jnp.float32)
    val = jnp.where(b == 0, jnp.float32(2.0**-127), val)
    return jnp.where(b == E8M0_NAN_BITS, jnp.float32(jnp.nan), val)
  e, m = (b >> 3) & 15, b & 7
  normal = lax.bitcast_convert_type((((e + 120) << 23) | (m << 20)).astype(jnp.uint32), jnp.float32)
  val = jnp.where(e > 0, normal, m.astype(jnp.float32) * jnp.float32(2.0**-9))
  return jnp.where(b == E4M3_NAN_BITS, jnp.float32(jnp.nan), val)


def dequant_halves(codes: jax.Array, scales: jax.Array, block: int, fmt_name: str) -> tuple[jax.Array, jax.Array]:
  """(r, bk/2) packed codes + (r, bk/block) scale bits -> the even and the odd elements, each (r, bk/2) bf16
  ``value · scale`` (exact)."""
  r, half = codes.shape
  s = scale_to_f32(scales, fmt_name).reshape(r, half // (block // 2), 1)

  def scaled(nibbles):
    v = e2m1_to_bf16(nibbles).astype(jnp.float32).reshape(r, half // (block // 2), block // 2)
    return (v * s).reshape(r, half).astype(jnp.bfloat16)

  return scaled(codes & 0xF), scaled(codes >> 4)


def _kernel(ac_ref, as_ref, bc_ref, bs_ref, g_ref, o_ref, *, out_shape, k: int, bk: int, block: int, fmt_name: str):
  bm, bn = o_ref.shape
  dims = (((1,), (1,)), ((), ()))

  def body(t, acc):
    a_even, a_odd = dequant_halves(ac_ref[:, pl.ds(t * (bk // 2), bk // 2)],
                                    as_ref[:, pl.ds(t * (bk // block), bk // block)], block, fmt_name)
    b_even, b_odd = dequant_halves(bc_ref[:, pl.ds(t * (bk // 2), bk // 2)],
                                    bs_ref[:, pl.ds(t * (bk // block), bk // block)], block, fmt_name)
    acc = acc + lax.dot_general(a_even, b_even, dims, preferred_element_type=jnp.float32)
    return acc + lax.dot_general(a_odd, b_odd, dims, preferred_element_type=jnp.float32)

  acc = lax.fori_loop(0, k // bk, body, jnp.zeros((bm, bn), jnp.float32))
  out_block = (pl.program_id(0), pl.program_id(1))  # rows of A / B past M / N only feed the masked-off outputs
  store_in_bounds(o_ref, (acc * g_ref[0]).astype(o_ref.dtype), out_block, out_shape)


def _check(a: QTensor, b: QTensor, tile):
  for name, q in (("a", a), ("b", b)):
    if not isinstance(q, QTensor) or len(q.shape) != 2 or q.axis != 1 or len(q.block_shape) != 1:
      raise ValueError(f"{name} must be a 2D QTensor quantized along its last axis with 1D blocks")
  if a.fmt != b.fmt or a.shape[1] != b.shape[1] or a.hadamard != b.hadamard:
    raise ValueError(f"a and b must share format, K and Hadamard size: {a.fmt.name}/{b.fmt.name}, "
                     f"K {a.shape[1]}/{b.shape[1]}, hadamard {a.hadamard}/{b.hadamard}")
  bm, bn, bk = tile
  if a.shape[1] % bk or bk % a.fmt.block_size:
    raise ValueError(f"K={a.shape[1]} must be a multiple of bk={bk}, itself a multiple of the block size")


def default_tile(m: int, k: int) -> tuple[int, int, int]:
  bm = min(128, max(16, 1 << (m - 1).bit_length()))
  return bm, 128, next((t for t in (128, 64, 32) if k % t == 0), 128)


@functools.partial(jax.jit, static_argnames=("tile", "out_dtype", "num_warps", "num_stages", "interpret"))
def matmul(a: QTensor, b: QTensor, *, tile=None, out_dtype=jnp.bfloat16, num_warps: int = 8,
           num_stages: int = 3, interpret: bool = False) -> jax.Array:
  """``dq(a) · dq(b)ᵀ`` (M, N) from packed FP4 operands, dequantized in the kernel; fp32 accumulation.

  ``tile`` = (bm, bn, bk), default (bm, 128, the largest of 128/64/32 dividing K) with bm = M rounded up to a power
  of two in [16, 128] (a skinny GEMM, e.g. decoding 16 tokens against packed weights, does not compute 128 rows).
  """
  tile = tuple(tile or default_tile(*a.shape))
  _check(a, b, tile)
  bm, bn, bk = tile
  (m, k), (n, _) = a.shape, b.shape
  block = a.fmt.block_size
  u8 = lambda s: lax.bitcast_convert_type(s, jnp.uint8)
  alpha = (a.global_scale * b.global_scale).reshape(1).astype(jnp.float32)
  kernel = functools.partial(_kernel, out_shape=(m, n), k=k, bk=bk, block=block, fmt_name=a.fmt.name)
  return pl.pallas_call(
      kernel,
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
      in_specs=[
          pl.BlockSpec((bm, k // 2), lambda i, j: (i, 0)), pl.BlockSpec((bm, k // block), lambda i, j: (i, 0)),
          pl.BlockSpec((bn, k // 2), lambda i, j: (j, 0)), pl.BlockSpec((bn, k // block), lambda i, j: (j, 0)),
          pl.BlockSpec((1,), lambda i, j: (0,)),
      ],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
      out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name=f"fp4_dequant_matmul_{a.fmt.name}",
  )(a.codes, u8(a.scales), b.codes, u8(b.scales), alpha)
