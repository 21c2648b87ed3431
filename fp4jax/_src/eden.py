"""MS-EDEN: unbiased micro-scaled rounding for NVFP4 (Quartet II; EDEN: Vargaftik et al., ICML 2022).

Under a random rotation R, EDEN's unbiased scale for a vector x quantized to Q(Rx) is ‖x‖² / ⟨Rx, Q(Rx)⟩.
MS-EDEN applies it per 16-element NVFP4 block, folding the correction into the E4M3 block scale:

1. x̂ = RHT128(x) with fresh random signs (done by the caller, ``fp4jax.quantize`` / the recipes);
2. tensor scale with headroom s_dec = amax / (255.99 · V_MAX), V_MAX = 6 / ((17/16) · 0.93) ≈ 6.07;
3. block scale s_b = rne_e4m3(amax_b · s_enc / V_MAX); elements v = x̂ / (s_b · s_dec);
4. q = rtn_e2m1(clamp(v, ±6));
5. c_b = Σ v² / Σ v · q over the block (1 when the block is all zero), both sums pairwise in a fixed order;
6. s_b' = stochastic_round_e4m3(s_b · c_b) — unbiased, so E[s_b'] = s_b · c_b;
7. output q · s_b' · s_dec.

Steps 2-4 are ``fp4jax.scaling`` with rule "eden"; this module holds steps 5-6.
"""

from __future__ import annotations

import jax.numpy as jnp

from fp4jax._src.formats import e2m1_decode
from fp4jax._src.ieee import div_rn
from fp4jax._src.reductions import pairwise_sum
from fp4jax._src.rounding import sr_e4m3


def correction(v: jnp.ndarray, codes: jnp.ndarray, axes: tuple[int, ...]) -> jnp.ndarray:
  """EDEN correction ``c = Σ v² / Σ v·value(q)`` reduced over ``axes`` (kept), 1 where the denominator is 0."""
  v = v.astype(jnp.float32)
  num = pairwise_sum(v * v, axes)  # a fixed summation order: the same bits on every backend and in the kernels
  den = pairwise_sum(v * e2m1_decode(codes), axes)
  return jnp.where(den > 0, div_rn(num, jnp.where(den > 0, den, 1.0)), jnp.float32(1.0))


def corrected_scale(dec: jnp.ndarray, c: jnp.ndarray, bits: jnp.ndarray) -> jnp.ndarray:
  """``s_b' = SR_e4m3(s_b · c)``: the block scale times the correction, stochastically rounded to E4M3.

  A block whose scale underflowed to 0 keeps 0 (it dequantizes to 0; its unclipped v = x·FLT_MAX would make c
  infinite and 0·c NaN); a NaN scale stays NaN.
  """
  return jnp.where(dec > 0, sr_e4m3(dec * c, bits), dec)
