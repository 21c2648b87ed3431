"""Reproduce Quartet II's quantization-error table for NVFP4 (and the MXFP4 OCP number), with the FP8 baselines.

Setup (Quartet II; FP4-REFERENCE §5): rows of 128 i.i.d. N(0,1) values, row r scaled by logspace(2^0 … 2^8),
a 128-point random Hadamard transform along rows, then each quantizer; relative MSE ‖x−Q(x)‖²/‖x‖², SNR bits and
misalignment 1 − ⟨x,Q⟩/⟨x,x⟩ averaged over independent keys. MXFP4: OCP "floor" RTN on plain N(0,1).
FP8 rows (no published numbers to compare): the same logspace rows without a Hadamard transform, quantized by
E4M3 per-tensor current scaling (the ``fp8`` recipe), MXFP8 (OCP "floor" and "rceil" scales; the ``mxfp8``
recipe's) and DeepSeek-V3's FP8 block scaling in 1x128 tiles and 128x128 blocks (the ``fp8_block`` recipe's).

    fp4jax-quant-error-table [--rows 8192] [--keys 16]
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import fp4jax
from fp4jax import hadamard, metrics

PUBLISHED = {  # relative MSE ×1e-3 and misalignment as published (Quartet II)
  "RTN": (9.0, 0.0079),
  "SR": (23.5, 0.0),
  "MS-EDEN (per-16)": (9.4, 0.0006),
  "4/6": (7.6, None),
  "16x16 2D": (12.4, None),
  "MXFP4 OCP RTN (no RHT)": (13.3, None),
  "FP8 E4M3 per-tensor (no RHT)": (None, None),
  "MXFP8 OCP floor (no RHT)": (None, None),
  "MXFP8 rceil (no RHT)": (None, None),
  "FP8 block 1x128 (no RHT)": (None, None),
  "FP8 block 128x128 (no RHT)": (None, None),
}


def _inputs(key, rows):
  k1, k2 = jax.random.split(key)
  scale = jnp.logspace(0.0, 8.0, rows, base=2.0)[:, None]
  x = jax.random.normal(k1, (rows, 128)) * scale
  return x, k2


def _quantizers():
  nv, four_six = fp4jax.NVFP4, dataclasses.replace(fp4jax.NVFP4, scale_mode="four_over_six")
  fake_blocks = fp4jax.fp8.fake_quantize_blocks
  rot = lambda f: lambda x, k: hadamard.inverse_hadamard(f(hadamard.hadamard(x, 128, signs=s(k)), k), 128, signs=s(k))
  s = lambda k: hadamard.random_signs(jax.random.fold_in(k, 1), 128)
  return {
    "RTN": rot(lambda x, k: fp4jax.fake_quantize(x, nv, hadamard=None)),
    "SR": rot(lambda x, k: fp4jax.fake_quantize(x, nv, rounding="sr", key=k, hadamard=None)),
    "MS-EDEN (per-16)": lambda x, k: fp4jax.fake_quantize(x, nv, rounding="eden", key=k),
    "4/6": rot(lambda x, k: fp4jax.fake_quantize(x, four_six, hadamard=None)),
    "16x16 2D": rot(lambda x, k: fp4jax.fake_quantize(x, nv, block_shape=(16, 16), hadamard=None)),
    "MXFP4 OCP RTN (no RHT)": None,
    "FP8 E4M3 per-tensor (no RHT)": lambda x, k: _fp8_tensor(x),
    "MXFP8 OCP floor (no RHT)": lambda x, k: fake_blocks(x, fp4jax.MXFP8),
    "MXFP8 rceil (no RHT)": lambda x, k: fake_blocks(x, dataclasses.replace(fp4jax.MXFP8, scale_mode="rceil")),
    "FP8 block 1x128 (no RHT)": lambda x, k: fake_blocks(x, fp4jax.FP8_BLOCK),
    "FP8 block 128x128 (no RHT)": lambda x, k: fake_blocks(x, fp4jax.FP8_BLOCK, block_shape=(128, 128)),
  }


def _fp8_tensor(x):
  v, inv_scale = fp4jax.fp8.quantize_fp8(x, fp4jax.E4M3)
  return v * inv_scale


def measure(rows: int, keys: int, seed: int = 0) -> dict[str, tuple[float, float, float, float]]:
  """name -> (rel. MSE, its std over keys, misalignment, its std over keys)."""
  out = {}
  for name, q in _quantizers().items():
    if q is None:
      f = jax.jit(lambda k: _pair(jax.random.normal(k, (rows, 128)), lambda x: fp4jax.fake_quantize(x, fp4jax.MXFP4)))
    else:
      f = jax.jit(lambda k, q=q: _pair(_inputs(k, rows)[0], lambda x: q(x, jax.random.fold_in(k, 7))))
    r = np.array([f(jax.random.key(seed * 1000 + i)) for i in range(keys)], np.float64)
    out[name] = (r[:, 0].mean(), r[:, 0].std(ddof=1), r[:, 1].mean(), r[:, 1].std(ddof=1))
  return out


def _pair(x, q):
  y = q(x)
  return jnp.stack([metrics.relative_mse(x, y), metrics.misalignment(x, y)])


def main(argv=None):
  p = argparse.ArgumentParser(
    prog="fp4jax-quant-error-table", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--rows", type=int, default=8192)
  p.add_argument("--keys", type=int, default=16)
  a = p.parse_args(argv)
  res = measure(a.rows, a.keys)
  print(f"rows={a.rows} keys={a.keys} jax={jax.__version__} backend={jax.default_backend()}")
  print("| quantizer | rel. MSE ×1e-3 (ours ± sd) | published | SNR bits | misalignment (ours ± sd) | published |")
  print("|---|---|---|---|---|---|")
  for name, (m, ms, mis, miss) in res.items():
    pub_m, pub_mis = PUBLISHED[name]
    pm = "—" if pub_mis is None else f"{pub_mis:.4f}"
    pub = "—" if pub_m is None else f"{pub_m:.1f}"
    print(
      f"| {name} | {m * 1e3:.2f} ± {ms * 1e3:.2f} | {pub} | {-0.5 * np.log2(m):.2f} | {mis:+.5f} ± {miss:.5f} | {pm} |"
    )


if __name__ == "__main__":
  main()
