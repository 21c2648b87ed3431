"""FP4 GEMM ``dq(A)·dq(B)ᵀ``: Pallas dequantize-in-kernel vs XLA (dequantize + dot), ``jax.nn.scaled_matmul`` and a
bf16 matmul of the same shape, one run, one table; and for bf16 activations, the fused quantize-GEMM
(``fused_forward``) vs the quantize kernel followed by the GEMM kernel.

    python benchmarks/kernels_gemm.py          # GPU: the timing table
    python benchmarks/kernels_gemm.py --few-rows   # GPU: M = 1..8, GEMV vs tensor cores
    python benchmarks/kernels_gemm.py --sass   # any machine: SASS per decoded element

Every row is timed over ``WEIGHTS`` distinct B operands in one jitted program (``benchtools.time_distinct_ms``):
device time per GEMM, with no host dispatch between GEMMs of tens of microseconds and no weights left in L2 from
the call before. The "pallas default" row is what ``fp4jax.packed_matmul``'s Pallas backend runs (the swapped
product for a few rows of A); the tile rows are the unswapped kernel.

``--sass`` compiles each GEMM kernel configuration of the table for sm_90 with PyPI's Triton
(``fp4jax_kernels.triton_ir``, a proxy) and prints its SASS instructions (the whole kernel: prologue, the
software-pipelined loop, epilogue), the same count over the elements one thread decodes per K chunk, and the
largest opcodes (``STL``/``LDL``: register spills).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
from benchtools import header, time_distinct_ms
from fp4jax_kernels import triton_ir
from fp4jax_kernels.contrib import fused_forward
from fp4jax_kernels.gemm import gemv, pallas_triton, reference
from fp4jax_kernels.native import matmul as native
from fp4jax_kernels.quantize import pallas_triton as quantize_kernel

import fp4jax

SHAPES = [(16, 8192, 8192), (8192, 4096, 4096)]  # (M, N, K); the memory-bound one first
# Activations quantized in the GEMM vs quantize kernel + GEMM kernel (X bf16 -> NVFP4 RTN, W packed).
FUSED_TILES = {
  (8192, 4096, 4096): [((128, 128, 64), 8, 2), ((128, 128, 128), 8, 2), ((64, 128, 64), 4, 2)],
  (16, 8192, 8192): [((16, 64, 256), 4, 2), ((16, 128, 128), 4, 2)],
}
# (tile, warps, stages, dots per K chunk: None is pallas_triton.default_dots)
TILES = {
  (8192, 4096, 4096): [
    ((128, 128, 128), 8, 3, None),
    ((128, 128, 128), 8, 3, 1),
    ((128, 256, 128), 8, 3, 2),
    ((128, 256, 64), 8, 3, None),
    ((128, 128, 64), 4, 4, None),
    ((256, 128, 64), 8, 3, None),
    ((128, 128, 128), 4, 3, None),
  ],
  (16, 8192, 8192): [
    ((16, 64, 128), 4, 4, None),
    ((16, 128, 128), 4, 4, None),
    ((16, 128, 128), 4, 4, 4),
    ((16, 64, 256), 4, 4, None),
    ((16, 128, 256), 4, 3, None),
    ((16, 256, 128), 8, 4, None),
  ],
}


def sass_counts(fmt=fp4jax.NVFP4) -> None:
  """SASS per decoded element and the top opcodes of each (shape, tile) of ``TILES``, split-K 1 (same loop body)."""
  for (m, n, k), configs in TILES.items():
    a = fp4jax.quantize(jnp.ones((min(m, 256), k)), fmt)
    b = fp4jax.quantize(jnp.ones((256, k)), fmt)
    for (bm, bn, bk), nw, ns, dots in configs:
      dots = dots or pallas_triton.default_dots(fmt, bm, bk)
      if dots > pallas_triton.dot_parts(fmt):
        continue
      fn = lambda a, b, tile=(bm, bn, bk), nw=nw, ns=ns, dots=dots: pallas_triton.matmul(  # noqa: E731
        a, b, tile=tile, num_warps=nw, num_stages=ns, split_k=1, dots=dots
      )
      (module,) = triton_ir.triton_modules(fn, a, b)
      ops = triton_ir.sass_histogram(triton_ir.compile_sm90(module, nw, ns))
      per_element = sum(ops.values()) / ((bm + bn) * bk / (32 * nw))
      top = ", ".join(f"{op} {c}" for op, c in ops.most_common(5))
      print(
        f"{f'{m}x{n}x{k}':16s} {fmt.name} ({bm}, {bn}, {bk}) w{nw} s{ns} dots {dots}: {sum(ops.values()):5d} SASS, "
        f"{per_element:5.1f} per decoded element; {top}",
        flush=True,
      )


FEW_ROWS = [(m, n, n) for n in (8192, 4096) for m in (1, 2, 4, 8)] + [(1, 28672, 8192)]  # GEMV vs tensor cores
WEIGHTS = 8  # distinct B operands per timed program (benchtools.time_distinct_ms)


def _weights(n: int, k: int):
  """``WEIGHTS`` distinct (n, k) B operands: bf16 and NVFP4-quantized."""
  xs = [jax.random.normal(key, (n, k), jnp.float32) for key in jax.random.split(jax.random.key(1), WEIGHTS)]
  return [x.astype(jnp.bfloat16) for x in xs], [fp4jax.quantize(x, fp4jax.NVFP4) for x in xs]


def _bf16_dot(p, q):
  return jnp.dot(p, q.T, preferred_element_type=jnp.float32).astype(jnp.bfloat16)


def few_rows() -> None:
  """Below a tile of rows: bf16, XLA's dequantize + dot, the tensor-core kernel and the CUDA-core GEMV at their
  defaults, and which of the two ``fp4jax_kernels.gemm.api.pallas_matmul`` runs (the GEMV up to ``gemv.ROWS`` rows)."""
  print(
    f"{'M x N x K':20s} {'bf16 ms':>8s} {'xla ms':>8s} {'tensor-core ms':>14s} {'gemv ms':>8s} "
    f"{'gemv vs bf16':>12s}  pallas runs"
  )
  for m, n, k in FEW_ROWS:
    xa = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
    a, (xbs, bs) = fp4jax.quantize(xa, fp4jax.NVFP4), _weights(n, k)
    bf = time_distinct_ms(_bf16_dot, [(xa.astype(jnp.bfloat16), w) for w in xbs])
    xla, tc, gv = (
      time_distinct_ms(f, [(a, w) for w in bs]) for f in (reference.matmul, pallas_triton.matmul, gemv.matmul)
    )
    print(
      f"{f'{m}x{n}x{k}':20s} {bf:8.4f} {xla:8.4f} {tc:14.4f} {gv:8.4f} {bf / gv:11.2f}x  "
      f"{'gemv' if m <= gemv.ROWS else 'tensor cores'}",
      flush=True,
    )


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--sass", action="store_true", help="SASS counts from PyPI's Triton, a proxy (no GPU needed)")
  p.add_argument("--few-rows", action="store_true", help="GPU: M = 1..8, GEMV vs tensor-core kernel vs bf16")
  args = p.parse_args()
  if args.sass:
    for fmt in (fp4jax.NVFP4, fp4jax.MXFP4):
      sass_counts(fmt)
    return
  print(header())
  if args.few_rows:
    few_rows()
    return
  print(f"{'M x N x K':20s} {'impl':44s} {'ms':>8s} {'TFLOP/s':>8s} {'vs bf16':>8s} {'rel.err':>9s}")
  for m, n, k in SHAPES:
    xa = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
    a, (bbs, bs) = fp4jax.quantize(xa, fp4jax.NVFP4), _weights(n, k)
    b = bs[0]
    ref = reference.matmul(a, b, out_dtype=jnp.float32)
    flops = 2 * m * n * k
    ab = xa.astype(jnp.bfloat16)
    per_call = lambda f, x, ws: time_distinct_ms(f, [(x, w) for w in ws])  # noqa: E731
    bf16_ms = per_call(_bf16_dot, ab, bbs)
    row = lambda impl, ms, err="": print(
      f"{f'{m}x{n}x{k}':20s} {impl:44s} {ms:8.3f} {flops / ms / 1e9:8.1f} {bf16_ms / ms:7.2f}x {err:>9s}", flush=True
    )
    row("bf16 jnp.dot", bf16_ms)
    row("xla dequantize + dot", per_call(reference.matmul, a, bs))
    y = pallas_triton.matmul(a, b).astype(jnp.float32)
    row(
      f"pallas default{' (swapped)' if m <= pallas_triton.SWAP_ROWS < n else ''}",
      per_call(pallas_triton.matmul, a, bs),
      f"{float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref)):.1e}",
    )
    for tile, nw, ns, dots in TILES[(m, n, k)]:
      dots = dots or pallas_triton.default_dots(fp4jax.NVFP4, tile[0], tile[2])
      split = pallas_triton.default_split_k(m, n, k, tile)
      splits = sorted({1, split, 2 * split} if split > 1 else {1})  # no split, the default and twice the default
      for split in splits:
        try:
          f = jax.jit(
            lambda a, b, tile=tile, nw=nw, ns=ns, split=split, dots=dots: pallas_triton.matmul(
              a, b, tile=tile, num_warps=nw, num_stages=ns, split_k=split, dots=dots
            )
          )
          y = f(a, b).astype(jnp.float32)
          err = float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))
          row(f"pallas {tile} w{nw} s{ns} d{dots} split-K {split}", per_call(f, a, bs), f"{err:.1e}")
        except Exception as e:
          print(
            f"{f'{m}x{n}x{k}':20s} pallas {tile} d{dots} split-K {split} FAILED {type(e).__name__}: {str(e)[:200]}",
            flush=True,
          )
    rtn = fp4jax.QuantizeSpec(fp4jax.NVFP4)
    two_pass = jax.jit(lambda x, b: pallas_triton.matmul(quantize_kernel.quantize(x, rtn)[0], b))
    fused_ref = reference.matmul(fp4jax.quantize(ab, fp4jax.NVFP4), b, out_dtype=jnp.float32)
    fused_rows = [("quantize kernel + pallas GEMM (X bf16)", two_pass)]
    for tile, nw, ns in FUSED_TILES[(m, n, k)]:
      fused_rows.append(
        (
          f"fused quantize-GEMM {tile} w{nw} s{ns}",
          jax.jit(
            lambda x, b, tile=tile, nw=nw, ns=ns: fused_forward.matmul(
              x, b, fmt=fp4jax.NVFP4, tile=tile, num_warps=nw, num_stages=ns
            )
          ),
        )
      )
    for name, f in fused_rows:
      try:
        y = f(ab, b).astype(jnp.float32)
        row(name, per_call(f, ab, bs), f"{float(jnp.linalg.norm(y - fused_ref) / jnp.linalg.norm(fused_ref)):.1e}")
      except Exception as e:
        print(f"{f'{m}x{n}x{k}':20s} {name} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
    try:
      y = native.matmul(a, b).astype(jnp.float32)
      err = float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))
      row("jax.nn.scaled_matmul (nvfp4)", per_call(native.matmul, a, bs), f"{err:.1e}")
    except Exception as e:
      print(f"{f'{m}x{n}x{k}':20s} jax.nn.scaled_matmul FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
  main()
