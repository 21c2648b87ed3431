"""FP4 GEMV on CUDA cores, Pallas on the Triton backend: ``out = dq(A) · dq(B)ᵀ`` for a few rows of A.

A few rows of activations against packed NVFP4 weights (decoding a token) have too little arithmetic to repay
staging decoded tiles for the tensor cores (``pallas_triton``), so each program owns ``bn`` rows of B and walks K
in chunks of ``bk`` with fused multiply-adds only:

* B's packed codes are read as uint32 words of 8 codes (``pallas_triton.code_words``) and decoded in registers to
  ``value · 2^-14`` (``pallas_triton.e2m1_words_to_f16``, exact), converted to fp32 (exact).
* A, a few rows, is decoded once by XLA before the kernel (``vector_parts``): ``A'[j, r, i] = value(a[r, 8i + j]) ·
  s_a`` in fp32, exact (at most 2 + 4 significant bits), laid out so that element j of every word of B meets
  element j of the same word of A.
* Per word (8 consecutive elements, half of one 16-block, so one scale on each side) the kernel forms
  ``h = Σ_j b_j · A'_j`` in fp32. Every product ``value_b · value_a · s_a · 2^-14`` is an integer multiple (at most
  144) of ``2^-16 · s_a``, so the 8-term sum is at most 1152 such units (11 bits) times ``s_a`` (4 significant
  bits): exact in fp32, in any order; ``h · (s_b · 2^14)`` is exact too (at most 11 + 4 + 4 significant bits).
* Only ``acc += h · s_b · 2^14`` rounds (fp32), once per word: the result differs from the XLA path (dequantize to
  fp32, then dot) by fp32 summation order only, like the tensor-core kernel's.

The tensor scales multiply once at the end (or after the split-K sum, as in ``pallas_triton``). NVFP4 only: E8M0
scales (MXFP4) span 2^±127, where ``s_b · 2^14`` overflows fp32; ``supports`` says which operands qualify.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from fp4jax._src.formats import NVFP4, NVFP4Format
from fp4jax._src.quantize import QTensor
from fp4jax_kernels.edge_blocks import store_in_bounds
from fp4jax_kernels.gemm import pallas_triton

MAX_ROWS = 8  # rows of A the kernel accepts; each adds one fp32 multiply-add per element of B
# rows sent here by ``fp4jax_kernels.gemm.api``: up to ROWS the GEMV is at least level with the tensor-core kernel,
# beyond it slower
ROWS = 2
MIN_PROGRAMS = 1024  # split-K target: about 8 programs per SM of a 132-SM Hopper GPU
_B_SCALE_EXP = 14  # B's values are decoded as value · 2^-14; its scales carry the 2^14 back


def supports(a: QTensor, b: QTensor) -> bool:
  """Whether ``matmul(a, b)`` applies: NVFP4 2D operands quantized along K with 1D blocks, at most ``MAX_ROWS`` rows of
  A, K a multiple of 32 (a 16-block is two words)."""
  return (
    all(
      isinstance(q, QTensor)
      and len(q.shape) == 2
      and q.axis == 1
      and len(q.block_shape) == 1
      and isinstance(q.fmt, NVFP4Format)
      and q.fmt.block_size == 16
      for q in (a, b)
    )
    and a.shape[0] <= MAX_ROWS
    and a.shape[1] % 32 == 0
  )


def vector_parts(a: QTensor, rows: int) -> jax.Array:
  """(8, rows, K/8) fp32: ``[j, r, i]`` = ``value(a[r, 8i + j]) · s_a`` (block scale, no tensor scale; exact), rows
  past ``a``'s zero."""
  m, k = a.shape
  values = pallas_triton.e2m1_to_f16(a.unpacked_codes()).astype(jnp.float32)
  scaled = (values.reshape(m, k // 16, 16) * a.scale_values()[:, :, None]).reshape(m, k // 8, 8)
  return jnp.pad(jnp.moveaxis(scaled, 2, 0), ((0, 0), (0, rows - m), (0, 0)))


def _kernel(ap_ref, bc_ref, bs_ref, g_ref, o_ref, *, out_shape, m: int, k: int, bk: int):
  """``bn`` rows of B against the ``m`` rows of A' over one K slice; ``o_ref`` is (rows, bn), or (1, rows, bn) for a
  split-K partial."""
  rows, bn = o_ref.shape[-2:]
  words, blocks = bk // 8, bk // 16
  n = out_shape[-1]
  inside = pl.program_id(0) * bn + lax.broadcasted_iota(jnp.int32, (bn, 1), 0) < n

  def load_b(ref, cols):  # the last program's rows past N are not read (the block would run past B's end)
    if n % bn == 0:
      return ref[:, cols]
    return plgpu.load(ref.at[:, cols], mask=jnp.broadcast_to(inside, (bn, cols.size)), other=jnp.zeros((), ref.dtype))

  def body(t, accs):
    b = [
      p.astype(jnp.float32)
      for p in pallas_triton.e2m1_words_to_f16(pallas_triton.code_words(load_b(bc_ref, pl.ds(t * (bk // 2), bk // 2))))
    ]
    s = NVFP4.decode_scale_bits(load_b(bs_ref, pl.ds(t * blocks, blocks))) * 2.0**_B_SCALE_EXP
    s = jnp.broadcast_to(s[:, :, None], (bn, blocks, 2)).reshape(bn, words)  # block c -> words 2c, 2c + 1
    out = []
    for r in range(m):
      h = b[0] * ap_ref[0, pl.ds(r, 1), pl.ds(t * words, words)]
      for j in range(1, pallas_triton.WORD_CODES):
        h = h + b[j] * ap_ref[j, pl.ds(r, 1), pl.ds(t * words, words)]
      out.append(accs[r] + h * s)
    return tuple(out)

  accs = lax.fori_loop(0, k // bk, body, tuple(jnp.zeros((bn, words), jnp.float32) for _ in range(m)))
  row = lax.broadcasted_iota(jnp.int32, (rows, bn), 0)
  y = sum(jnp.where(row == r, jnp.sum(acc, axis=1)[None, :], 0.0) for r, acc in enumerate(accs))
  if len(o_ref.shape) == 3:  # split-K partial: alpha and the cast come after the sum over slices
    store_in_bounds(o_ref, y.reshape(1, rows, bn), (pl.program_id(1), 0, pl.program_id(0)), out_shape)
  else:
    store_in_bounds(o_ref, (y * g_ref[0]).astype(o_ref.dtype), (0, pl.program_id(0)), out_shape)


def default_config(k: int) -> tuple[int, int, int]:
  """(bn, bk, num_warps) (the tile sweep's choice): (64, 256) w4, bk the largest of 256, 128, 64, 32 dividing K."""
  return 64, next(t for t in (256, 128, 64, 32) if k % t == 0), 4


@functools.partial(jax.jit, static_argnames=("bn", "bk", "num_warps", "split_k", "out_dtype", "interpret"))
def matmul(
  a: QTensor,
  b: QTensor,
  *,
  bn: int | None = None,
  bk: int | None = None,
  num_warps: int | None = None,
  split_k: int | None = None,
  out_dtype=jnp.bfloat16,
  interpret: bool = False,
) -> jax.Array:
  """``dq(a) · dq(b)ᵀ`` (M, N) for ``M <= MAX_ROWS`` rows of A, on CUDA cores (see the module docstring).

  ``bn`` rows of B per program, K chunks of ``bk``, ``num_warps``: defaults from ``default_config``. ``split_k``: K
  slices summed in fp32 after the kernel; default ``pallas_triton.default_split_k`` towards ``MIN_PROGRAMS``.
  """
  if not supports(a, b):
    raise ValueError(
      f"gemv.matmul needs NVFP4 2D operands quantized along K, at most {MAX_ROWS} rows of a and K a "
      f"multiple of 32; got a {a.fmt.name} {a.shape}, b {b.fmt.name} {b.shape}"
    )
  if a.shape[1] != b.shape[1] or a.hadamard != b.hadamard:
    raise ValueError(
      f"a and b must share K and Hadamard size: K {a.shape[1]}/{b.shape[1]}, hadamard {a.hadamard}/{b.hadamard}"
    )
  (m, k), n = a.shape, b.shape[0]
  default_bn, default_bk, default_warps = default_config(k)
  bn, bk, num_warps = bn or default_bn, bk or default_bk, num_warps or default_warps
  rows = 1 << (m - 1).bit_length()
  if split_k is None:
    split_k = pallas_triton.default_split_k(rows, n, k, (rows, bn, bk), MIN_PROGRAMS)
  if k % bk or bk % 32 or split_k < 1 or k % (split_k * bk):
    raise ValueError(
      f"bk={bk} must be a multiple of 32 and split_k={split_k} >= 1 must cut K={k} into whole multiples of bk"
    )
  ks, split = k // split_k, split_k > 1
  alpha = (a.global_scale * b.global_scale).reshape(1).astype(jnp.float32)
  out_shape = (split_k, m, n) if split else (m, n)
  y = pl.pallas_call(
    functools.partial(_kernel, out_shape=out_shape, m=m, k=ks, bk=bk),
    grid=(pl.cdiv(n, bn), split_k),
    in_specs=[
      pl.BlockSpec((pallas_triton.WORD_CODES, rows, ks // 8), lambda j, p: (0, 0, p)),
      pl.BlockSpec((bn, ks // 2), lambda j, p: (j, p)),
      pl.BlockSpec((bn, ks // 16), lambda j, p: (j, p)),
      pl.BlockSpec((1,), lambda j, p: (0,)),
    ],
    out_specs=(
      pl.BlockSpec((1, rows, bn), lambda j, p: (p, 0, j)) if split else pl.BlockSpec((rows, bn), lambda j, p: (0, j))
    ),
    out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32 if split else out_dtype),
    compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
    interpret=interpret,
    name="fp4_gemv_nvfp4",
  )(vector_parts(a, rows), b.codes, lax.bitcast_convert_type(b.scales, jnp.uint8), alpha)
  return (jnp.sum(y, axis=0) * alpha[0]).astype(out_dtype) if split else y
