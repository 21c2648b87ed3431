"""Dequantize-in-kernel FP4 GEMM, Pallas on the Triton backend: ``out = dq(A) · dq(B)ᵀ``.

A (M, K) and B (N, K) are ``fp4jax.QTensor`` s quantized along K (1D blocks; NVFP4 or MXFP4, either Hadamard domain
as long as both share it). Each program owns a (bm, bn) output tile and walks K in chunks of bk: it reads bk/2 code
bytes and bk/block scale bytes per row of each operand, rebuilds ``value(q) · scale_b`` exactly (at most 2 + 4
significant bits) and feeds the tensor cores (``dot_general``, fp32 accumulate). NVFP4 operands are float16:
a nonzero ``|value · scale_b|`` lies in [2^-10, 6 · 448], in float16's normal range, and the E2M1 code decodes to
float16 bits in a few integer operations (``e2m1_to_f16``; the float16 multiply by the scale is packed, two per
instruction). MXFP4's power-of-two scales span 2^±127, so its operands are bfloat16.
The nibbles are never interleaved back into K order: a byte holds elements 2j (low) and 2j + 1 (high), and
``Σ_k a_k b_k = Σ_j a_2j b_2j + Σ_j a_2j+1 b_2j+1``, so each chunk is two dots, of the low and of the high nibbles
(each element of the half-width arrays takes the scale of block ``j // (block/2)``).
The tensor scales multiply the fp32 accumulator once in the epilogue (as the hardware's alpha), so the result
differs from the XLA path (dequantize to fp32, then dot) only by fp32 summation order.

Split-K: a skinny GEMM (decoding a few tokens against packed weights) has too few (bm, bn) tiles to occupy the GPU
and is bound by reading B. With ``split_k = s`` the grid gets a third axis: program p sums K's p-th 1/s slice into
an fp32 partial (s, M, N), and XLA adds the s partials (fp32) before alpha and the cast.
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


def e2m1_to_f16(codes: jax.Array) -> jax.Array:
  """float16 value of uint8 E2M1 codes by building the float16 bit pattern (integer operations only, exact).

  Code ``s ee m``: ``ee > 0`` -> ``(-1)^s · 2^(ee-1) · (1 + m/2)`` = bits ``s<<15 | (ee + 14)<<10 | m<<9``, i.e.
  ``(c & 7) << 9`` plus 14 in the exponent field (``0x3800``); ``ee == 0`` -> ``(-1)^s · m/2``, bits ``m · 0x3800``
  (0.5 is ``0x3800``). No float operation, so no compiler can reassociate a scaling into an overflow.
  """
  c = codes.astype(jnp.uint16)
  mag = jnp.where((c & 6) != 0, ((c & 7) << 9) + 0x3800, (c & 1) * 0x3800)
  return lax.bitcast_convert_type(((c & 8) << 12) | mag, jnp.float16)


def operand_dtype(fmt_name: str):
  """The dtype the GEMM kernels decode ``fmt_name`` operands to: float16 for NVFP4, bfloat16 for MXFP4 (both exact)."""
  return jnp.float16 if fmt_name == "nvfp4" else jnp.bfloat16


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
  """(r, bk/2) packed codes + (r, bk/block) scale bits -> the even and the odd elements, each (r, bk/2)
  ``value · scale`` (exact) in ``operand_dtype(fmt_name)``."""
  r, half = codes.shape
  groups = (r, half // (block // 2), block // 2)
  s = scale_to_f32(scales, fmt_name).reshape(r, half // (block // 2), 1)

  def scaled(nibbles):
    if fmt_name == "nvfp4":  # E4M3 scales are float16 values: one exact float16 multiply
      return (e2m1_to_f16(nibbles).reshape(groups) * s.astype(jnp.float16)).reshape(r, half)
    v = e2m1_to_bf16(nibbles).astype(jnp.float32).reshape(groups)
    return (v * s).reshape(r, half).astype(jnp.bfloat16)

  return scaled(codes & 0xF), scaled(codes >> 4)


def _kernel(ac_ref, as_ref, bc_ref, bs_ref, g_ref, o_ref, *, out_shape, k: int, bk: int, block: int, fmt_name: str):
  """One (bm, bn) tile of the output (or, split-K, of one K slice's fp32 partial: ``o_ref`` is (1, bm, bn))."""
  bm, bn = o_ref.shape[-2:]
  dims = (((1,), (1,)), ((), ()))

  def body(t, acc):
    a_even, a_odd = dequant_halves(ac_ref[:, pl.ds(t * (bk // 2), bk // 2)],
                                    as_ref[:, pl.ds(t * (bk // block), bk // block)], block, fmt_name)
    b_even, b_odd = dequant_halves(bc_ref[:, pl.ds(t * (bk // 2), bk // 2)],
                                    bs_ref[:, pl.ds(t * (bk // block), bk // block)], block, fmt_name)
    acc = acc + lax.dot_general(a_even, b_even, dims, preferred_element_type=jnp.float32)
    return acc + lax.dot_general(a_odd, b_odd, dims, preferred_element_type=jnp.float32)

  acc = lax.fori_loop(0, k // bk, body, jnp.zeros((bm, bn), jnp.float32))
  if len(o_ref.shape) == 3:  # split-K partial: alpha and the cast come after the sum over slices
    out_block, acc = (pl.program_id(2), pl.program_id(0), pl.program_id(1)), acc.reshape(1, bm, bn)
  else:  # rows of A / B past M / N only feed the masked-off outputs
    out_block, acc = (pl.program_id(0), pl.program_id(1)), acc * g_ref[0]
  store_in_bounds(o_ref, acc.astype(o_ref.dtype), out_block, out_shape)


def _check(a: QTensor, b: QTensor, tile, split_k: int):
  for name, q in (("a", a), ("b", b)):
    if not isinstance(q, QTensor) or len(q.shape) != 2 or q.axis != 1 or len(q.block_shape) != 1:
      raise ValueError(f"{name} must be a 2D QTensor quantized along its last axis with 1D blocks")
  if a.fmt != b.fmt or a.shape[1] != b.shape[1] or a.hadamard != b.hadamard:
    raise ValueError(f"a and b must share format, K and Hadamard size: {a.fmt.name}/{b.fmt.name}, "
                     f"K {a.shape[1]}/{b.shape[1]}, hadamard {a.hadamard}/{b.hadamard}")
  bm, bn, bk = tile
  if a.shape[1] % bk or bk % a.fmt.block_size:
    raise ValueError(f"K={a.shape[1]} must be a multiple of bk={bk}, itself a multiple of the block size")
  if split_k < 1 or a.shape[1] % (split_k * bk):
    raise ValueError(f"split_k={split_k} must be >= 1 and divide K={a.shape[1]} into whole multiples of bk={bk}")


def default_config(m: int, k: int) -> tuple[tuple[int, int, int], int, int]:
  """((bm, bn, bk), num_warps, num_stages), the fastest measured on an H200 (BENCHMARKS.md §5): bm = M rounded up
  to a power of two in [16, 128]; (128, 256, 64) w8 s3 for large M, (bm, 128, 128) w4 s4 for skinny M (bk: the
  largest of those dividing K)."""
  bm = min(128, max(16, 1 << (m - 1).bit_length()))
  if bm == 128:
    return (bm, 256, next((t for t in (64, 32) if k % t == 0), 64)), 8, 3
  return (bm, 128, next((t for t in (128, 64, 32) if k % t == 0), 128)), 4, 4


MIN_PROGRAMS = 512  # about 4 per SM of an H100 / H200 (132 SMs)


def default_split_k(m: int, n: int, k: int, tile) -> int:
  """1 unless the output has fewer than ``MIN_PROGRAMS`` tiles; then the largest power of two that brings the grid
  to about ``MIN_PROGRAMS`` programs while each K slice keeps at least 4 chunks of bk."""
  bm, bn, bk = tile
  tiles = -(-m // bm) * -(-n // bn)
  s = 1
  while tiles * s < MIN_PROGRAMS and k % (2 * s * bk) == 0 and k // (2 * s * bk) >= 4:
    s *= 2
  return s


@functools.partial(jax.jit, static_argnames=("tile", "out_dtype", "num_warps", "num_stages", "interpret", "split_k"))
def matmul(a: QTensor, b: QTensor, *, tile=None, out_dtype=jnp.bfloat16, num_warps: int | None = None,
           num_stages: int | None = None, interpret: bool = False, split_k: int | None = None) -> jax.Array:
  """``dq(a) · dq(b)ᵀ`` (M, N) from packed FP4 operands, dequantized in the kernel; fp32 accumulation.

  ``tile`` = (bm, bn, bk), ``num_warps``, ``num_stages``: defaults from ``default_config`` (a skinny GEMM, e.g.
  decoding 16 tokens against packed weights, does not compute 128 rows). ``split_k``: K slices summed in fp32 after
  the kernel (see the module docstring); default ``default_split_k``.
  """
  default_tile, default_warps, default_stages = default_config(*a.shape)
  tile = tuple(tile or default_tile)
  num_warps, num_stages = num_warps or default_warps, num_stages or default_stages
  (m, k), (n, _) = a.shape, b.shape
  split_k = default_split_k(m, n, k, tile) if split_k is None else split_k
  _check(a, b, tile, split_k)
  bm, bn, bk = tile
  block, ks = a.fmt.block_size, k // split_k
  u8 = lambda s: lax.bitcast_convert_type(s, jnp.uint8)
  alpha = (a.global_scale * b.global_scale).reshape(1).astype(jnp.float32)
  split = split_k > 1
  out_shape = (split_k, m, n) if split else (m, n)
  kernel = functools.partial(_kernel, out_shape=out_shape, k=ks, bk=bk, block=block, fmt_name=a.fmt.name)
  y = pl.pallas_call(
      kernel,
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), split_k),
      in_specs=[
          pl.BlockSpec((bm, ks // 2), lambda i, j, p: (i, p)), pl.BlockSpec((bm, ks // block), lambda i, j, p: (i, p)),
          pl.BlockSpec((bn, ks // 2), lambda i, j, p: (j, p)), pl.BlockSpec((bn, ks // block), lambda i, j, p: (j, p)),
          pl.BlockSpec((1,), lambda i, j, p: (0,)),
      ],
      out_specs=(pl.BlockSpec((1, bm, bn), lambda i, j, p: (p, i, j)) if split
                 else pl.BlockSpec((bm, bn), lambda i, j, p: (i, j))),
      out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32 if split else out_dtype),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name=f"fp4_dequant_matmul_{a.fmt.name}",
  )(a.codes, u8(a.scales), b.codes, u8(b.scales), alpha)
  return (jnp.sum(y, axis=0) * alpha[0]).astype(out_dtype) if split else y
