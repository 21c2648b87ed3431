"""Fused forward GEMM, Pallas on the Triton backend: activations rotated and quantized on the fly.

``Y = dq(q(rot(X))) · dq(W)ᵀ`` for X (M, K) float32/bfloat16 and W a packed NVFP4 ``QTensor`` (N, K) quantized along
K in the same Hadamard domain. Each program owns a (bm, bn) output tile and walks K in chunks of bk: it reads the
(bm, bk) tile of X, applies the blockwise Hadamard (``pallas_triton.rotate_rows``: the butterflies and bf16 rounding
of ``fp4jax.hadamard``), quantizes it with the foundation's ``quantize_blocks`` (NVFP4 RTN, absmax or four-over-six
block scales, the tensor amax of a pre-pass) into exact float16 ``value · dec_b``, dequantizes W's codes the same
way (``pallas_triton.dequant_halves``), and feeds the tensor cores (float16 operands, fp32 accumulation); both tensor
scales multiply the accumulator once at the end. The quantized X equals ``fp4jax.quantize(X, ...)`` bit for bit; the
result differs from dequantize-then-dot (``gemm.reference``) only by the fp32 summation order.

The trade against quantize-then-GEMM (``quantize.pallas_triton`` + ``gemm.pallas_triton``): X's quantized tile never
goes to HBM (saving a write and a read of 0.56 bytes per element), but every program of a row of output tiles
quantizes the same X tile again, N/bn times; which one wins per shape is for the benchmark
(``benchmarks/kernels_gemm.py``) to say.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from fp4jax._src.formats import FP4Format, NVFP4Format
from fp4jax._src.quantize import BlockLayout, QTensor, decode_blocks, quantize_blocks
from fp4jax._src.spec import QuantizeSpec
from fp4jax_kernels.gemm.pallas_triton import dequant_halves
from fp4jax_kernels.quantize import pallas_triton as quantize_kernel
from fp4jax_kernels.quantize.output import KernelOutput
from fp4jax_kernels.triton_compat import kernel_safe


def _kernel(*refs, fmt: FP4Format, hadamard: int, has_signs: bool, k: int, bk: int, bf16_input: bool, interpret: bool):
  it = iter(refs)
  x_ref, amax_ref = next(it), next(it)
  signs_ref = next(it) if has_signs else None
  wc_ref, ws_ref, alpha_ref, o_ref = next(it), next(it), next(it), next(it)
  bm, bn = o_ref.shape
  block = fmt.block_size
  lay = BlockLayout((bm, bk), 1, (block,))
  quantize = kernel_safe(lambda xb, amax: quantize_blocks(xb, lay, fmt, "rtn", None, None, amax), interpret=interpret)
  decode = kernel_safe(decode_blocks, interpret=interpret)
  dims = (((1,), (1,)), ((), ()))

  def body(t, acc):
    x = x_ref[:, pl.ds(t * bk, bk)].astype(jnp.float32)
    if hadamard:
      x = quantize_kernel.rotate_rows(x, hadamard, None if signs_ref is None else signs_ref[...], bf16_input)
    codes, dec, _, _ = quantize(x.reshape(lay.blocked), amax_ref[0])
    xv = decode(codes, dec, jnp.float32(1.0)).reshape(bm, bk).astype(fmt.gemm_dtype)  # exact
    x_even, x_odd = (h.reshape(bm, bk // 2) for h in jnp.split(xv.reshape(bm, bk // 2, 2), 2, axis=-1))
    w_even, w_odd = dequant_halves(
      wc_ref[:, pl.ds(t * (bk // 2), bk // 2)], ws_ref[:, pl.ds(t * (bk // block), bk // block)], block, fmt
    )
    acc = acc + lax.dot_general(x_even, w_even, dims, preferred_element_type=jnp.float32)
    return acc + lax.dot_general(x_odd, w_odd, dims, preferred_element_type=jnp.float32)

  acc = lax.fori_loop(0, k // bk, body, jnp.zeros((bm, bn), jnp.float32))
  o_ref[...] = (acc * alpha_ref[0]).astype(o_ref.dtype)


def _check(x: jax.Array, w: QTensor, fmt: FP4Format, hadamard: int, tile):
  if x.ndim != 2 or x.dtype not in (jnp.float32, jnp.bfloat16):
    raise ValueError(f"x must be a 2D float32 or bfloat16 array, got {x.dtype}{list(x.shape)}")
  if not isinstance(w, QTensor) or len(w.shape) != 2 or w.axis != 1 or len(w.block_shape) != 1:
    raise ValueError("w must be a 2D QTensor quantized along its last axis (K) with 1D blocks")
  if not isinstance(fmt, NVFP4Format) or w.fmt != fmt:
    raise ValueError(f"fmt must be an NVFP4 format equal to w's, got fmt={fmt} and w.fmt={w.fmt}")
  if fmt.four_over_six_reference == "te":
    raise ValueError("fmt.four_over_six_reference='te' (TE's 4over6 arithmetic) runs only in fp4jax.quantize")
  if w.shape[1] != x.shape[1] or (w.hadamard or 0) != hadamard:
    raise ValueError(
      f"x and w must share K and the Hadamard size: K {x.shape[1]}/{w.shape[1]}, hadamard {hadamard}/{w.hadamard}"
    )
  (m, k), n = x.shape, w.shape[0]
  bm, bn, bk = tile
  if m % bm or n % bn or k % bk or bk % max(fmt.block_size, hadamard or 1):
    raise ValueError(
      f"tile {tile} must divide (M, N, K) = {(m, n, k)}, with bk a multiple of the block "
      f"({fmt.block_size}) and of the Hadamard size ({hadamard})"
    )


@functools.partial(
  jax.jit, static_argnames=("fmt", "hadamard", "tile", "out_dtype", "num_warps", "num_stages", "interpret")
)
def matmul(
  x: jax.Array,
  w: QTensor,
  *,
  fmt: FP4Format,
  hadamard: int = 0,
  signs: jax.Array | None = None,
  tile=(128, 128, 64),
  out_dtype=jnp.bfloat16,
  num_warps: int = 8,
  num_stages: int = 2,
  interpret: bool = False,
) -> jax.Array:
  """``dq(quantize(x, fmt, hadamard=hadamard, signs=signs)) · dq(w)ᵀ`` (M, N), X quantized inside the GEMM.

  ``fmt``: NVFP4 (``scale_mode`` "absmax" or "four_over_six"), RTN. ``hadamard``: 0 or the blockwise Hadamard size
  along K (``signs``: its sign vector, or None for none), which must be w's. ``tile`` = (bm, bn, bk) must divide
  (M, N, K). The per-tensor amax of the rotated X is one pre-pass (``quantize.pallas_triton.tensor_amax``).
  """
  tile = tuple(tile)
  _check(x, w, fmt, hadamard, tile)
  (m, k), n = x.shape, w.shape[0]
  bm, bn, bk = tile
  block = fmt.block_size
  mode = "random" if signs is not None else "none"
  amax = quantize_kernel.tensor_amax(
    x, QuantizeSpec(fmt, hadamard=hadamard, signs=mode), KernelOutput(), signs, interpret=interpret
  )
  args = [x, amax.reshape(1)]
  in_specs = [pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((1,), lambda i, j: (0,))]
  if signs is not None:
    args.append(jnp.asarray(signs, jnp.float32))
    in_specs.append(pl.BlockSpec((hadamard,), lambda i, j: (0,)))
  alpha = fmt.tensor_scales(amax, "rtn")[1] * w.global_scale.astype(jnp.float32)
  args += [w.codes, lax.bitcast_convert_type(w.scales, jnp.uint8), alpha.reshape(1)]
  in_specs += [
    pl.BlockSpec((bn, k // 2), lambda i, j: (j, 0)),
    pl.BlockSpec((bn, k // block), lambda i, j: (j, 0)),
    pl.BlockSpec((1,), lambda i, j: (0,)),
  ]
  kernel = functools.partial(
    _kernel,
    fmt=fmt,
    hadamard=hadamard,
    has_signs=signs is not None,
    k=k,
    bk=bk,
    bf16_input=x.dtype == jnp.bfloat16,
    interpret=interpret,
  )
  return pl.pallas_call(
    kernel,
    grid=(m // bm, n // bn),
    in_specs=in_specs,
    out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
    out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
    compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
    interpret=interpret,
    name=f"fp4_fused_forward_{fmt.name}",
  )(*args)
