"""Dequantize-in-kernel FP4 GEMM, Pallas on the Triton backend: ``out = dq(A) · dq(B)ᵀ``.

A (M, K) and B (N, K) are ``fp4jax.QTensor`` s quantized along K (1D blocks; NVFP4 or MXFP4, either Hadamard domain
as long as both share it). Each program owns a (bm, bn) output tile and walks K in chunks of bk: it reads the packed
codes and the bk/block scale bytes per row of each operand, rebuilds ``value(q) · scale_b`` exactly (at most 2 + 4
significant bits) and feeds the tensor cores (``dot_general``, fp32 accumulate).

NVFP4 operands are float16, decoded from uint32 words of 8 codes (assembled in the kernel, ``code_words``;
``dequant_words``): per pair of elements two integer operations place both codes under float16's exponent and
mantissa (``value · 2^-14``, exact, subnormal for the codes ±0.5), and one packed float16 multiply by
``scale_b · 2^7`` gives ``value · scale_b · 2^-7``, exact; the epilogue's alpha takes the 2^14 of the two operands
back (exact, a power of two). The 8 elements of a word
are never interleaved back into K order: element e of every word forms one part, and ``Σ_k a_k b_k = Σ_e Σ_i
a_8i+e b_8i+e``, so each chunk is up to 8 dots, or fewer after joining parts in registers (``joined``; A and B
alike). MXFP4's power-of-two scales span 2^±127, so its operands are bfloat16, decoded per byte (``dequant_halves``:
the low and the high nibbles, two parts).
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

from fp4jax._src.formats import NVFP4, FP4Format
from fp4jax._src.quantize import QTensor
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


WORD_CODES = 8  # E2M1 codes per uint32 word of packed NVFP4 codes
WORD_SCALE_EXP = 7  # NVFP4 operands are decoded as value · scale · 2^-7; the epilogue multiplies by 2^14


def e2m1_words_to_f16(words: jax.Array) -> list[jax.Array]:
  """uint32 words of 8 packed E2M1 codes -> 8 float16 arrays, the e-th holding element e of every word as
  ``value · 2^-14`` (exact; integer operations only).

  A word is 4 little-endian code bytes: element e (K index 8i + e of word i) in bits 4e..4e+3. Shifted left by
  4·(3 − j), it has element j's code ``s ee m`` in bits 12-15 and element j + 4's in bits 28-31;
  ``(x & 0x80008000) | ((x >> 3) & 0x0E000E00)`` moves each ``ee m`` to bits 9-11 of its half, under float16's
  exponent and top mantissa bit, sign kept: ``(-1)^s · 2^(ee-15) · (1 + m/2)`` for ee > 0 and the subnormal
  ``(-1)^s · m · 2^-15`` for ee = 0, i.e. value · 2^-14 in both cases, two elements in three operations.
  """
  out = [None] * WORD_CODES
  for j in range(4):
    x = words << (4 * (3 - j)) if j < 3 else words
    y = (x & jnp.uint32(0x80008000)) | ((x >> 3) & jnp.uint32(0x0E000E00))
    out[j] = lax.bitcast_convert_type((y & 0xFFFF).astype(jnp.uint16), jnp.float16)
    out[j + 4] = lax.bitcast_convert_type((y >> 16).astype(jnp.uint16), jnp.float16)
  return out


def dequant_words(words: jax.Array, scales: jax.Array) -> list[jax.Array]:
  """(r, bk/8) uint32 NVFP4 code words + (r, bk/16) E4M3 scale bits -> 8 float16 arrays (r, bk/8), the e-th
  ``value · scale_b · 2^-7`` of element e of each word (exact, see below; one float16 multiply per element).

  ``value · 2^-14`` (``e2m1_words_to_f16``) times ``scale_b · 2^7`` (exact in float16: at most 4 significant bits,
  in [2^-2, 57344]) is a multiple of 2^-17 below 21 with at most 6 significant bits, so exact in float16 even
  where subnormal. Words 2b and 2b + 1 hold block b.
  """
  r, w = words.shape
  s = (NVFP4.decode_scale_bits(scales) * 2.0**WORD_SCALE_EXP).astype(jnp.float16)
  s = jnp.broadcast_to(s[:, :, None], (r, w // 2, 2)).reshape(r, w)
  return [v * s for v in e2m1_words_to_f16(words)]


def code_words(codes: jax.Array) -> jax.Array:
  """(r, c) uint8 packed codes -> (r, c/4) uint32 words, byte 0 in the low bits (in-kernel: a sum of shifted bytes,
  which never overlap; no XLA pass over the codes)."""
  r, c = codes.shape
  b = codes.reshape(r, c // 4, 4).astype(jnp.uint32)
  return jnp.sum(b << (8 * lax.broadcasted_iota(jnp.uint32, b.shape, 2)), axis=-1, dtype=jnp.uint32)


def dequant_halves(codes: jax.Array, scales: jax.Array, block: int, fmt: FP4Format) -> tuple[jax.Array, jax.Array]:
  """(r, bk/2) packed codes + (r, bk/block) scale bits -> the even and the odd elements, each (r, bk/2)
  ``value · scale`` (exact) in ``fmt.gemm_dtype`` (float16 for NVFP4, bfloat16 for MXFP4)."""
  r, half = codes.shape
  groups = (r, half // (block // 2), block // 2)
  s = fmt.decode_scale_bits(scales).reshape(r, half // (block // 2), 1)

  def scaled(nibbles):
    if fmt.gemm_dtype == jnp.float16:  # E4M3 scales are float16 values: one exact float16 multiply
      return (e2m1_to_f16(nibbles).reshape(groups) * s.astype(jnp.float16)).reshape(r, half)
    v = e2m1_to_bf16(nibbles).astype(jnp.float32).reshape(groups)
    return (v * s).reshape(r, half).astype(jnp.bfloat16)

  return scaled(codes & 0xF), scaled(codes >> 4)


def joined(parts: list[jax.Array], n: int) -> list[jax.Array]:
  """``n`` operands from the decoded ``parts`` (a power-of-two count, each (r, w)): parts i and i + len/2 are
  interleaved along the last axis (``jnp.stack`` on a new last axis: Triton's register-level join) until ``n``
  remain. A and B pass through the same joins, so every dot pairs the same K indices."""
  while len(parts) > n:
    h = len(parts) // 2
    parts = [jnp.stack([x, y], axis=-1).reshape(x.shape[0], 2 * x.shape[1]) for x, y in zip(parts[:h], parts[h:])]
  return parts


def _kernel(
  ac_ref, as_ref, bc_ref, bs_ref, g_ref, o_ref, *, out_shape, k: int, bk: int, block: int, fmt: FP4Format, dots: int
):
  """One (bm, bn) tile of the output (or, split-K, of one K slice's fp32 partial: ``o_ref`` is (1, bm, bn)); each K
  chunk is ``dots`` tensor-core dots (see ``joined``)."""
  bm, bn = o_ref.shape[-2:]
  dims = (((1,), (1,)), ((), ()))

  def operands(c_ref, s_ref, t):
    c, s = c_ref[:, pl.ds(t * (bk // 2), bk // 2)], s_ref[:, pl.ds(t * (bk // block), bk // block)]
    parts = dequant_words(code_words(c), s) if _words(fmt) else list(dequant_halves(c, s, block, fmt))
    return joined(parts, dots)

  def body(t, acc):
    for a, b in zip(operands(ac_ref, as_ref, t), operands(bc_ref, bs_ref, t)):
      acc = acc + lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)  # Triton: dot(a, b, acc)
    return acc

  acc = lax.fori_loop(0, k // bk, body, jnp.zeros((bm, bn), jnp.float32))
  if len(o_ref.shape) == 3:  # split-K partial: alpha and the cast come after the sum over slices
    out_block, acc = (pl.program_id(2), pl.program_id(0), pl.program_id(1)), acc.reshape(1, bm, bn)
  else:  # rows of A / B past M / N only feed the masked-off outputs
    out_block, acc = (pl.program_id(0), pl.program_id(1)), acc * g_ref[0]
  store_in_bounds(o_ref, acc.astype(o_ref.dtype), out_block, out_shape)


def _check(a: QTensor, b: QTensor, tile, split_k: int, dots: int):
  for name, q in (("a", a), ("b", b)):
    if not isinstance(q, QTensor) or len(q.shape) != 2 or q.axis != 1 or len(q.block_shape) != 1:
      raise ValueError(f"{name} must be a 2D QTensor quantized along its last axis with 1D blocks")
  if a.fmt != b.fmt or a.shape[1] != b.shape[1] or a.hadamard != b.hadamard:
    raise ValueError(
      f"a and b must share format, K and Hadamard size: {a.fmt.name}/{b.fmt.name}, "
      f"K {a.shape[1]}/{b.shape[1]}, hadamard {a.hadamard}/{b.hadamard}"
    )
  bm, bn, bk = tile
  if a.shape[1] % bk or bk % a.fmt.block_size:
    raise ValueError(f"K={a.shape[1]} must be a multiple of bk={bk}, itself a multiple of the block size")
  if split_k < 1 or a.shape[1] % (split_k * bk):
    raise ValueError(f"split_k={split_k} must be >= 1 and divide K={a.shape[1]} into whole multiples of bk={bk}")
  parts = dot_parts(a.fmt)
  if dots not in (1, 2, 4, 8) or dots > parts or bk // dots < 16:
    raise ValueError(f"dots={dots} must be a power of two <= {parts} ({a.fmt.name}) with bk/dots >= 16 (bk={bk})")


def _rows_tile(m: int) -> int:
  """``m`` rounded up to a power of two, at least 16 (a tensor-core tile dimension)."""
  return max(16, 1 << (m - 1).bit_length())


def _k_chunk(k: int) -> int:
  """bk: the largest of 128, 64, 32 dividing ``k`` (else 128, which ``_check`` rejects)."""
  return next((t for t in (128, 64, 32) if k % t == 0), 128)


def default_config(m: int, k: int) -> tuple[tuple[int, int, int], int, int]:
  """((bm, bn, bk), num_warps, num_stages) (the tile sweep's choice): bm = M rounded up to a power of two in
  [16, 128]; (128, 128, 128) w8 s3 for large M, (bm, 128, 128) w4 s4 for skinny M, with
  bn = 64 for M <= 16 (bk: the largest of 128, 64, 32 dividing K)."""
  bm = min(128, _rows_tile(m))
  bk = _k_chunk(k)
  return ((bm, 128, bk), 8, 3) if bm == 128 else ((bm, 64 if bm == 16 else 128, bk), 4, 4)


def _words(fmt: FP4Format) -> bool:
  """Whether ``fmt``'s operands decode as whole 8-code words (``dequant_words``): float16 GEMM operands (E4M3
  scales) in 16-element blocks, i.e. NVFP4; other formats decode by halves (``dequant_halves``)."""
  return fmt.gemm_dtype == jnp.float16 and fmt.block_size == 16


def dot_parts(fmt: FP4Format) -> int:
  """Decoded parts per K chunk, the most dots ``joined`` can split it into: ``WORD_CODES`` words, or two halves."""
  return WORD_CODES if _words(fmt) else 2


def default_dots(fmt: FP4Format, bm: int, bk: int) -> int:
  """Tensor-core dots per K chunk (``joined``; the tile sweep's choice): NVFP4 parts joined into one dot for skinny
  tiles (bm < 64) and into two for larger ones (each dot's K at least 16). MXFP4: its two halves, unjoined (PyPI's
  Triton 3.9 fails to compile the joined bfloat16 operands for sm_90)."""
  if not _words(fmt):
    return 2
  return 1 if bm < 64 or bk < 32 else 2


def swapped_config(m: int, k: int) -> tuple[tuple[int, int, int], int, int]:
  """((bm, bn, bk), num_warps, num_stages) of the swapped product ``(dq(B)·dq(A)ᵀ)ᵀ`` for ``m <= SWAP_ROWS`` rows of
  A: 64 rows of B per tile, A's rows as bn (a power of two, at least 16), w4 s4, bk as in ``default_config``."""
  return (64, _rows_tile(m), _k_chunk(k)), 4, 4


SWAP_ROWS = 32  # A with at most this many rows: the swapped product by default
MIN_PROGRAMS = 512  # about 4 per SM of a 132-SM Hopper GPU


def default_split_k(m: int, n: int, k: int, tile, min_programs: int = MIN_PROGRAMS) -> int:
  """1 unless the output has fewer than ``min_programs`` tiles; then the largest power of two that brings the grid
  to about ``min_programs`` programs while each K slice keeps at least 4 chunks of bk."""
  bm, bn, bk = tile
  tiles = -(-m // bm) * -(-n // bn)
  s = 1
  while tiles * s < min_programs and k % (2 * s * bk) == 0 and k // (2 * s * bk) >= 4:
    s *= 2
  return s


@functools.partial(
  jax.jit, static_argnames=("tile", "out_dtype", "num_warps", "num_stages", "interpret", "split_k", "dots", "swap")
)
def matmul(
  a: QTensor,
  b: QTensor,
  *,
  tile=None,
  out_dtype=jnp.bfloat16,
  num_warps: int | None = None,
  num_stages: int | None = None,
  interpret: bool = False,
  split_k: int | None = None,
  dots: int | None = None,
  swap: bool | None = None,
) -> jax.Array:
  """``dq(a) · dq(b)ᵀ`` (M, N) from packed FP4 operands, dequantized in the kernel; fp32 accumulation.

  ``tile`` = (bm, bn, bk), ``num_warps``, ``num_stages``: defaults from ``default_config``. ``split_k``: K slices
  summed in fp32 after the kernel (see the module docstring); default ``default_split_k``. ``dots``: tensor-core
  dots per K chunk (``joined``); default ``default_dots``.

  ``swap``: compute ``(dq(b) · dq(a)ᵀ)ᵀ`` instead, B's rows (e.g. packed weights) as the tiles' rows and A's few
  rows (e.g. 16 decoded tokens) as their columns; ``tile`` and the rest then describe that product (defaults
  ``swapped_config``). Default: swap when ``a`` has at most ``SWAP_ROWS`` rows, ``b`` more, and no ``tile`` is given
  (the tiles' rows are then B's, not mostly padding). The sums are the same; their fp32 order may differ.
  """
  (m, k), n = a.shape, b.shape[0]
  if swap is None:
    swap = tile is None and m <= SWAP_ROWS < n
  if swap:
    tile, warps, stages = swapped_config(m, k) if tile is None else (tile, num_warps, num_stages)
    return matmul(
      b,
      a,
      tile=tile,
      out_dtype=out_dtype,
      num_warps=num_warps or warps,
      num_stages=num_stages or stages,
      interpret=interpret,
      split_k=split_k,
      dots=dots,
      swap=False,
    ).T
  default_tile, default_warps, default_stages = default_config(*a.shape)
  tile = tuple(tile or default_tile)
  num_warps, num_stages = num_warps or default_warps, num_stages or default_stages
  split_k = default_split_k(m, n, k, tile) if split_k is None else split_k
  bm, bn, bk = tile
  dots = dots or default_dots(a.fmt, bm, bk)
  _check(a, b, tile, split_k, dots)
  block, ks = a.fmt.block_size, k // split_k
  u8 = lambda s: lax.bitcast_convert_type(s, jnp.uint8)
  unscale = 2.0 ** (2 * WORD_SCALE_EXP) if _words(a.fmt) else 1.0  # NVFP4 operands: value · scale · 2^-7
  alpha = (a.global_scale * b.global_scale).reshape(1).astype(jnp.float32) * unscale
  split = split_k > 1
  out_shape = (split_k, m, n) if split else (m, n)
  kernel = functools.partial(_kernel, out_shape=out_shape, k=ks, bk=bk, block=block, fmt=a.fmt, dots=dots)
  y = pl.pallas_call(
    kernel,
    grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), split_k),
    in_specs=[
      pl.BlockSpec((bm, ks // 2), lambda i, j, p: (i, p)),
      pl.BlockSpec((bm, ks // block), lambda i, j, p: (i, p)),
      pl.BlockSpec((bn, ks // 2), lambda i, j, p: (j, p)),
      pl.BlockSpec((bn, ks // block), lambda i, j, p: (j, p)),
      pl.BlockSpec((1,), lambda i, j, p: (0,)),
    ],
    out_specs=(
      pl.BlockSpec((1, bm, bn), lambda i, j, p: (p, i, j)) if split else pl.BlockSpec((bm, bn), lambda i, j, p: (i, j))
    ),
    out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32 if split else out_dtype),
    compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
    interpret=interpret,
    name=f"fp4_dequant_matmul_{a.fmt.name}",
  )(a.codes, u8(a.scales), b.codes, u8(b.scales), alpha)
  return (jnp.sum(y, axis=0) * alpha[0]).astype(out_dtype) if split else y
