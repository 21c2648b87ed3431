"""Quantize kernels vs a device-to-device copy of the same tensor (and the pure-JAX path), one run, one table.

    PYTHONPATH=.:kernels python -m fp4jax_kernels.quantize.bench [--rows 16384 --cols 8192]

"% copy BW" = (bytes the op must move at least: read x once + write codes and scales) / time, over the copy's
(read + write) / time. The Pallas rows include the amax pre-pass (a second read of x, see pallas_triton);
"kernel only" subtracts the separately timed pre-pass.
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp

import fp4jax
from fp4jax_kernels.benchtools import header, time_ms
from fp4jax_kernels.quantize import pallas_triton
from fp4jax_kernels.quantize.spec import QuantizeSpec

OPS = {  # name: (spec, tiles to try as (tile, num_warps))
    "nvfp4_rtn_1x16": (QuantizeSpec(fp4jax.NVFP4), [((16, 256), 4), ((32, 256), 4), ((64, 256), 4), ((64, 256), 8),
                                                    ((16, 512), 4), ((16, 256), 2)]),
    "nvfp4_rht16_sr": (QuantizeSpec(fp4jax.NVFP4, rounding="sr", hadamard=16, hadamard_signs="te"),
                       [((16, 256), 4), ((32, 256), 8)]),
    "nvfp4_ms_eden_rht128": (QuantizeSpec(fp4jax.NVFP4, rounding="eden", hadamard=128, hadamard_signs="random"),
                             [((16, 256), 4), ((32, 128), 4)]),
    "mxfp4_rtn_1x32": (QuantizeSpec(fp4jax.MXFP4), [((16, 256), 4)]),
    "nvfp4_rtn_cols": (QuantizeSpec(fp4jax.NVFP4, along="cols"), [((256, 32), 4), ((128, 64), 4), ((256, 64), 8)]),
}


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--rows", type=int, default=16384)
  p.add_argument("--cols", type=int, default=8192)
  args = p.parse_args()
  m, k = args.rows, args.cols
  x = jax.random.normal(jax.random.key(0), (m, k), jnp.float32).astype(jnp.bfloat16)
  key = jax.random.key(1)
  print(header())
  n = m * k
  copy_ms = min(time_ms(jax.jit(lambda x: jnp.array(x, copy=True)), x), time_ms(jax.jit(lambda x: -x), x))
  copy_bw = 2 * 2 * n / copy_ms / 1e6
  print(f"shape {m}x{k} bf16; copy {copy_ms:.3f} ms = {copy_bw:.0f} GB/s (read + write)")
  print(f"{'op':24s} {'impl':28s} {'ms':>8s} {'% copy BW':>10s} {'kernel-only ms':>15s}")
  for name, (spec, tiles) in OPS.items():
    min_bytes = 2 * n + n // 2 + n // spec.block
    pct = lambda ms: 100 * (min_bytes / ms / 1e6) / copy_bw
    signs = fp4jax.hadamard.TE_SIGNS_16 if spec.hadamard_signs == "te" else None
    pre = time_ms(jax.jit(lambda x: pallas_triton.tensor_amax(x, spec, signs)), x) if spec.fmt.name == "nvfp4" else 0.0
    if spec.hadamard:
      xla_pre = time_ms(jax.jit(lambda x: pallas_triton.tensor_amax(x, spec, signs, use_kernel=False)), x)
      print(f"{name:24s} {'amax pre-pass, xla hadamard':28s} {xla_pre:8.3f}", flush=True)
    for tile, nw in tiles:
      try:
        f = jax.jit(lambda x, key, tile=tile, nw=nw: pallas_triton.quantize(x, spec, key, tile=tile, num_warps=nw)[0])
        ms = time_ms(f, x, key)
        print(f"{name:24s} {f'pallas {tile} w{nw}':28s} {ms:8.3f} {pct(ms):9.1f}% {ms - pre:15.3f}", flush=True)
      except Exception as e:  # a tile that fails to compile is reported, not fatal
        print(f"{name:24s} {f'pallas {tile} w{nw}':28s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
    if spec.along == "cols":  # the alternative to the in-kernel transpose: XLA transposes x, the rows kernel runs
      rows_spec = dataclasses.replace(spec, along="rows")
      ms = time_ms(jax.jit(lambda x: pallas_triton.quantize(x.T, rows_spec)[0]), x)
      print(f"{name:24s} {'xla x.T + pallas rows':28s} {ms:8.3f} {pct(ms):9.1f}% {ms - pre:15.3f}", flush=True)
    kw = spec.quantize_kwargs
    for impl, fn in (("xla fp4jax.quantize", fp4jax.quantize), ("xla fp4jax.fake_quantize", fp4jax.fake_quantize)):
      ms = time_ms(jax.jit(lambda x, key, fn=fn: fn(x, spec.fmt, key=key, **kw)), x, key)
      print(f"{name:24s} {impl:28s} {ms:8.3f} {pct(ms):9.1f}% {'':>15s}", flush=True)
    print(f"{name:24s} {'amax pre-pass (used)':28s} {pre:8.3f}", flush=True)


if __name__ == "__main__":
  main()
