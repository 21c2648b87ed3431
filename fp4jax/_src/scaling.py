"""Tensor and block scales for NVFP4 and MXFP4.

NVFP4 (NVIDIA Transformer Engine's reference quantizer ``NVFP4QuantizerRef``; arXiv 2509.25149), all fp32, in
this order:

    amax  = max|x|;   s_enc = min(6·448 / amax, FLT_MAX)   (1 when amax == 0);   s_dec = 1 / s_enc
    dec_b = rne_e4m3(clamp(amax_b · (s_enc · f32(1/6)), ±448));   enc_b = min(1 / (f32(dec_b) · s_dec), FLT_MAX)

Every operation is IEEE fp32 with subnormals, as TE's reference computes, on every backend: divisions are correctly
rounded (``fp4jax.ieee.div_rn``; XLA:GPU's own is not) and subnormal quotients kept, so for amax below 2688·2^-126
(about 3.2e-35) ``s_dec`` is the subnormal TE stores; ``dec_b · s_dec`` is an exact integer product
(``fp4jax.ieee.mul_short_rn``), and a subnormal ``amax_b`` is counted at its value (``fp4jax.ieee.mul_unflushed``)
although XLA on CPU flushes subnormals. Below amax = 2688 / FLT_MAX (about 7.9e-36) ``s_enc`` is FLT_MAX.

Variants change the tensor-scale numerator and the block target ``t`` (``amax_b`` maps to ``t``):
``"absmax"`` 6·448, t = 6 (TE); ``"four_over_six"`` 6·256, t = 6 or 4 per block (Quartet II; the 4/6 choice
itself is made in ``fp4jax.quantize``); MS-EDEN 255.99·V_MAX_EDEN, t = V_MAX_EDEN (Quartet II, headroom so the
corrected scale cannot overflow E4M3).

MXFP4 (OCP MX v1.0; power-of-two ``float8_e8m0fnu`` scales 2^e, e in [-127, 127]):
``"floor"`` e = floor(log2 amax_b) - 2 (elements clamp at ±6); ``"rceil"`` e = ceil(log2(amax_b / 6)) in exact
arithmetic, the smallest e with 6·2^e >= amax_b (no clipping);
``"floor_headroom"`` e as "floor" with elements pre-scaled by 3/4 (``x·0.75·2^-e`` rounded once) so amax_b/s lands
in [3, 6) (Quartet backward, after Tseng et al. arXiv 2502.20586; the 4/3 is returned in the tensor decode scale);
``"quest"`` e = floor(log2(0.48708·σ_b + 1e-8)) with σ_b the block's standard deviation (QuEST / Quartet forward,
0.48708 = 2.92247856/6, the MSE-optimal E2M1 clip of N(0,1)); ``"quest_nearest"`` the nearest power of two instead
(log-domain nearest: round up iff mantissa >= sqrt 2). All-zero blocks get e = -127, the smallest scale.
Exponents are read from the float32 bits (subnormal ``amax_b`` included), so no backend's subnormal flushing changes
them.
"""

from __future__ import annotations

import math

import jax.lax as lax
import jax.numpy as jnp
import numpy as np

from fp4jax._src.elements import E2M1_MAX, E4M3_MAX, FLT_MAX, floor_log2
from fp4jax._src.ieee import div_rn, mul_short_rn, mul_unflushed, significand
from fp4jax._src.rounding import rtn_e4m3

E8M0_EMIN, E8M0_EMAX = -127, 127
V_MAX_EDEN = 6.0 / ((17.0 / 16.0) * 0.93)
QUEST_CLIP = 2.92247856
_SQRT2_SIGNIFICAND = np.uint32(np.float32(math.sqrt(2.0)).view(np.uint32) & 0x7FFFFF | 0x800000)
_THREE_HALVES_SIGNIFICAND = np.uint32(0xC00000)
_NUMERATOR = {"absmax": 6.0 * 448.0, "four_over_six": 6.0 * 256.0, "eden": 255.99 * V_MAX_EDEN}


def nvfp4_tensor_scales(amax: jnp.ndarray, rule: str) -> tuple[jnp.ndarray, jnp.ndarray]:
  """``(s_enc, s_dec)`` from the tensor ``amax`` (fp32 scalar). Non-finite ``amax`` gives NaN scales.

  ``s_enc = min(N / amax, FLT_MAX)`` with N = 2688 (``rule="absmax"``), 1536 (``"four_over_six"``) or
  255.99·V_MAX_EDEN (``"eden"``); ``s_enc = 1`` when amax == 0; ``s_dec = 1 / s_enc``. Both divisions are correctly
  rounded IEEE fp32 (``fp4jax.ieee.div_rn``), subnormal quotients kept.

  Args:
    amax: max|x| of the tensor, a non-negative scalar (cast to float32).
    rule: ``"absmax"``, ``"four_over_six"`` or ``"eden"``.

  Returns:
    ``(s_enc, s_dec)``: two float32 scalars.

  Raises:
    KeyError: ``rule`` is not one of the three names.
  """
  amax = amax.astype(jnp.float32)
  s_enc = jnp.minimum(div_rn(jnp.float32(_NUMERATOR[rule]), amax), jnp.float32(FLT_MAX))
  zero = lax.bitcast_convert_type(amax, jnp.int32) & np.int32(0x7FFFFFFF) == 0  # a float compare flushes on CPU
  s_enc = jnp.where(zero, jnp.float32(1.0), s_enc)
  s_enc = jnp.where(jnp.isfinite(amax), s_enc, jnp.float32(jnp.nan))
  return s_enc, div_rn(jnp.float32(1.0), s_enc)


def nvfp4_block_scales(amax_b: jnp.ndarray, s_enc: jnp.ndarray, s_dec: jnp.ndarray, target: float = E2M1_MAX):
  """``(dec_b, enc_b)``: the E4M3 block decode scale (as fp32) and the fp32 element encode scale.

  ``dec_b = rne_e4m3(clamp(amax_b · (s_enc · f32(1/target)), ±448))``, ``enc_b = min(1 / (dec_b · s_dec), FLT_MAX)``.
  A block whose scale rounds to 0 gets ``enc_b = FLT_MAX`` (its codes saturate, and it dequantizes to 0).

  Args:
    amax_b: float32 max|x| of each block, any shape.
    s_enc: float32 tensor encode scale (``nvfp4_tensor_scales``), broadcastable against ``amax_b``.
    s_dec: float32 tensor decode scale, broadcastable against ``amax_b``.
    target: the E2M1 value a block's amax maps to (6, or 4 for Quartet II's 4/6 choice, ``V_MAX_EDEN`` for
      MS-EDEN).

  Returns:
    ``(dec_b, enc_b)``: two float32 arrays of the broadcast shape; ``dec_b`` on the E4M3 grid in [0, 448].
  """
  ratio = s_enc * jnp.float32(1.0 / target)
  dec = rtn_e4m3(jnp.clip(mul_unflushed(amax_b, ratio), -E4M3_MAX, E4M3_MAX))
  enc = jnp.minimum(div_rn(jnp.float32(1.0), mul_short_rn(dec, s_dec)), jnp.float32(FLT_MAX))
  return dec, enc


def _nearest_log2(x: jnp.ndarray) -> jnp.ndarray:
  """Nearest power-of-two exponent in the log domain: floor(log2 x) + [x / 2^floor >= f32(sqrt 2)]."""
  return floor_log2(x) + (_normalized_significand(x) >= _SQRT2_SIGNIFICAND).astype(jnp.int32)


def _normalized_significand(x: jnp.ndarray) -> jnp.ndarray:
  """uint32 ``x / 2^floor(log2 x) · 2^23`` for finite ``x > 0`` (in [2^23, 2^24)), subnormals normalized: exact."""
  return significand(x.astype(jnp.float32))[1]


def mx_exponents(amax_b: jnp.ndarray, mode: str, sigma_b: jnp.ndarray | None = None) -> jnp.ndarray:
  """int32 E8M0 exponents ``e`` (scale 2^e) per block for an MXFP4 ``mode`` (see module docstring).

  Clipped to [-127, 127]; an all-zero block gets -127.

  Args:
    amax_b: float32 max|x| of each block, any shape.
    mode: ``"floor"``, ``"floor_headroom"``, ``"rceil"``, ``"quest"`` or ``"quest_nearest"``.
    sigma_b: float32 standard deviation of each block, of ``amax_b``'s shape; needed by the ``"quest"`` modes only.

  Returns:
    int32 array of ``amax_b``'s shape.

  Raises:
    ValueError: an unknown ``mode``, or a ``"quest"`` mode without ``sigma_b``.
  """
  if mode in ("floor", "floor_headroom"):
    e = floor_log2(amax_b) - 2
  elif mode == "rceil":  # smallest e with 6·2^e >= amax_b, exactly: amax_b in [2^f, 2^(f+1))
    e = floor_log2(amax_b) - 2 + (_normalized_significand(amax_b) > _THREE_HALVES_SIGNIFICAND).astype(jnp.int32)
  elif mode in ("quest", "quest_nearest"):
    if sigma_b is None:
      raise ValueError("mx_exponents: mode 'quest' needs sigma_b, the per-block standard deviation")
    target = jnp.float32(QUEST_CLIP / E2M1_MAX) * sigma_b + jnp.float32(1e-8)
    e = floor_log2(target) if mode == "quest" else _nearest_log2(target)
  else:
    raise ValueError(f"unknown MXFP4 scale mode {mode!r}")
  zero = lax.bitcast_convert_type(amax_b.astype(jnp.float32), jnp.int32) & np.int32(0x7FFFFFFF) == 0
  return jnp.where(zero, jnp.int32(E8M0_EMIN), jnp.clip(e, E8M0_EMIN, E8M0_EMAX).astype(jnp.int32))


def nvfp4_rule(scale_mode: str, rounding: str) -> str:
  """The NVFP4 tensor/block scale rule of a format's ``scale_mode`` under ``rounding``: MS-EDEN's own rule for
  ``rounding="eden"``, else the mode ("absmax" or "four_over_six")."""
  return "eden" if rounding == "eden" else scale_mode


def mx_element_prescale(mode: str) -> float:
  """Factor applied to elements before the block scale: 3/4 for ``"floor_headroom"``, else 1.

  Args:
    mode: an MXFP4 scale mode (not validated here).

  Returns:
    0.75 or 1.0 (a Python float).
  """
  return 0.75 if mode == "floor_headroom" else 1.0
