"""Pure-JAX quantizer throughput vs a device copy, measured in the same run (issue 2's baseline).

Times jitted ``fake_quantize`` (bf16 in, bf16 out) and ``quantize`` (bf16 in, packed codes + scales out) on a
16384x8192 bf16 tensor, against ``-x`` (one read, one write of the same bytes: the copy ceiling). Reports the median
of ``--iters`` timings (each the mean of 10 back-to-back calls) after warm-up, effective bandwidth (bytes read +
written) and the ratio to the copy.

    python benchmarks/bench_fake_quantize.py [--shape 16384 8192] [--iters 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import time

import jax
import jax.numpy as jnp
import numpy as np

import fp4jax

NV, MX = fp4jax.NVFP4, fp4jax.MXFP4
CASES = {
  "NVFP4 RTN 1x16": dict(fmt=NV),
  "NVFP4 RHT16(TE signs) + SR": dict(fmt=NV, rounding="sr", hadamard=16, hadamard_signs="te"),
  "NVFP4 MS-EDEN (RHT128)": dict(fmt=NV, rounding="eden"),
  "NVFP4 4/6 RTN": dict(fmt=dataclasses.replace(NV, scale_mode="four_over_six")),
  "NVFP4 16x16 RTN": dict(fmt=NV, block_shape=(16, 16)),
  "MXFP4 RTN": dict(fmt=MX),
}


def timeit(f, *args, iters: int, calls: int = 10) -> float:
  """Median over ``iters`` of the mean time of ``calls`` back-to-back calls (launch overhead amortized)."""
  for _ in range(3):
    jax.block_until_ready(f(*args))
  ts = []
  for _ in range(iters):
    t0 = time.perf_counter()
    for _ in range(calls):
      out = f(*args)
    jax.block_until_ready(out)
    ts.append((time.perf_counter() - t0) / calls)
  return float(np.median(ts))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--shape", type=int, nargs=2, default=(16384, 8192))
  p.add_argument("--iters", type=int, default=20)
  a = p.parse_args(argv)
  m, n = a.shape
  x = jax.random.normal(jax.random.key(0), (m, n), jnp.bfloat16)
  key = jax.random.key(1)
  nbytes = 2 * x.size * 2  # read + write bf16
  copy = jax.jit(lambda v: -v)
  timeit(copy, x, iters=a.iters)  # warm the clocks before the reference measurement
  copy_t = timeit(copy, x, iters=a.iters)
  dev = jax.devices()[0]
  print(f"device={dev.device_kind} jax={jax.__version__} date={datetime.date.today()} shape={m}x{n} bf16")
  print("| op | time (ms) | GB/s (read+write) | vs copy |")
  print("|---|---|---|---|")
  print(f"| copy (-x) | {copy_t * 1e3:.3f} | {nbytes / copy_t / 1e9:.0f} | 1.00 |")
  for name, kw in CASES.items():
    kw = dict(kw)
    fmt = kw.pop("fmt")
    fq = jax.jit(lambda v, k, fmt=fmt, kw=kw: fp4jax.fake_quantize(v, fmt, key=k, **kw))
    t = timeit(fq, x, key, iters=a.iters)
    print(f"| fake_quantize {name} | {t * 1e3:.3f} | {nbytes / t / 1e9:.0f} | {copy_t / t:.2f} |")
    q = jax.jit(lambda v, k, fmt=fmt, kw=kw: fp4jax.quantize(v, fmt, key=k, **kw))
    t = timeit(q, x, key, iters=a.iters)
    qbytes = x.size * 2 + x.size // 2 + x.size // fmt.block_size
    print(f"| quantize (packed) {name} | {t * 1e3:.3f} | {qbytes / t / 1e9:.0f} | {copy_t / t * qbytes / nbytes:.2f} |")
  copy_after = timeit(copy, x, iters=a.iters)
  print(f"copy again after the table: {copy_after * 1e3:.3f} ms (drift check)")


if __name__ == "__main__":
  main()
