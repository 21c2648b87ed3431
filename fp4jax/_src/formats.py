"""FP4 element and scale formats: E2M1 codes, E4M3 and E8M0 scales, the NVFP4 and MXFP4 specs.

E2M1 (OCP MX v1.0, NVIDIA PTX ``e2m1``): 1 sign, 2 exponent, 1 mantissa bit, no Inf/NaN.
Magnitudes by code 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; codes 8..15 are the same magnitudes negated
(the sign is bit 3; code 8 is -0).

Every function here is exact integer/float arithmetic: nothing relies on ``astype`` to round, because
XLA on GPU removes convert pairs under ``jit`` (f32 -> f4 -> f32 is not a rounding there).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.lax as lax
import jax.numpy as jnp
import numpy as np

E2M1_MAX = 6.0
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
E2M1_SIGN_BIT = 8
E4M3_MAX = 448.0
E4M3_NAN_BITS = 0x7F
F32_INF_BITS = 0x7F800000  # float32 +Inf; every NaN's magnitude bits (sign cleared) are larger
E8M0_NAN_BITS = 0xFF
E8M0_BIAS = 127
FLT_MAX = float(np.finfo(np.float32).max)


def e2m1_decode(codes: jnp.ndarray) -> jnp.ndarray:
  """Value of 4-bit E2M1 codes (uint8 in 0..15) as float32, by building the float32 bit pattern (no table gather).

  Code ``s ee m`` (``k = c & 7`` = ``ee m``): ``e > 0`` -> ``2^(e-1)·(1 + m/2)``, float32 bits
  ``(k << 22) + (126 << 23)``; ``e == 0`` -> ``m/2``, bits ``m · bits(0.5)``; the sign is bit 3 -> bit 31.
  """
  c = codes.astype(jnp.int32)
  k = c & 7
  mag = jnp.where(k > 1, (k << 22) + (126 << 23), k * 0x3F000000)
  return lax.bitcast_convert_type(mag | ((c & E2M1_SIGN_BIT) << 28), jnp.float32)


def pow2(e: jnp.ndarray) -> jnp.ndarray:
  """Exact float32 ``2^e`` for integer ``e`` in [-149, 127], built from the bit pattern."""
  e = e.astype(jnp.int32)
  normal_bits = (jnp.clip(e, -126, 127) + 127).astype(jnp.uint32) << 23
  sub_bits = jnp.uint32(1) << jnp.clip(e + 149, 0, 22).astype(jnp.uint32)
  bits = jnp.where(e >= -126, normal_bits, sub_bits)
  return lax.bitcast_convert_type(bits, jnp.float32)


def floor_log2(x: jnp.ndarray) -> jnp.ndarray:
  """``floor(log2(x))`` for finite ``x > 0`` read from the float32 exponent field (exact, subnormals too).

  Returns int32; the value for ``x == 0`` is -150 (below every representable exponent).
  """
  x = x.astype(jnp.float32)
  bits = lax.bitcast_convert_type(jnp.abs(x), jnp.uint32)
  biased = (bits >> 23).astype(jnp.int32)
  mant = (bits & 0x7FFFFF).astype(jnp.uint32)
  # Subnormal: exponent of the leading mantissa bit, -149 + index of the highest set bit.
  highest = 31 - _clz32(mant)
  sub = -149 + highest
  return jnp.where(biased > 0, biased - 127, jnp.where(mant > 0, sub, -150))


def _clz32(x: jnp.ndarray) -> jnp.ndarray:
  return lax.clz(x.astype(jnp.uint32)).astype(jnp.int32)


def e4m3_step_exponent(x: jnp.ndarray) -> jnp.ndarray:
  """int32 ``e`` with ``2^e`` the spacing of the E4M3 grid at ``|x|``: ``max(floor(log2|x|), -6) - 3`` (-9 in E4M3's
  subnormal range), from the float32 exponent field (below 2^-6 the field's value no longer matters)."""
  biased = (lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32) >> 23) & 0xFF
  return jnp.maximum(biased - 127, -6) - 3


@dataclasses.dataclass(frozen=True)
class FP4Format:
  """A block-scaled 4-bit floating-point format: E2M1 elements, one scale per ``block_size`` elements.

  Attributes:
    name: ``"nvfp4"`` or ``"mxfp4"``.
    block_size: elements per scale along the quantized axis (16 for NVFP4, 32 for MXFP4).
    scale_dtype: ``float8_e4m3fn`` (NVFP4) or ``float8_e8m0fnu`` (MXFP4).
    tensor_scale: whether an FP32 per-tensor scale sits above the block scales (NVFP4).
    scale_mode: how block scales are chosen, see ``fp4jax.scaling``. NVFP4: ``"absmax"`` (Transformer Engine's
      reference quantizer) or ``"four_over_six"`` (Quartet II). MXFP4: ``"floor"`` (OCP MX v1.0),
      ``"rceil"``, ``"quest"`` / ``"quest_nearest"`` (Quartet forward) or ``"floor_headroom"`` (Quartet backward, 3/4).
  """

  name: str
  block_size: int
  scale_dtype: Any
  tensor_scale: bool
  scale_mode: str

  def __post_init__(self):
    modes = _SCALE_MODES.get(self.name)
    if modes is None:
      raise ValueError(f"FP4Format.name must be one of {sorted(_SCALE_MODES)}, got {self.name!r}")
    if self.scale_mode not in modes:
      raise ValueError(f"FP4Format.scale_mode for {self.name} must be one of {modes}, got {self.scale_mode!r}")
    if self.block_size <= 0 or self.block_size % 2:
      raise ValueError(f"FP4Format.block_size must be a positive even integer, got {self.block_size}")


_SCALE_MODES = {
    "nvfp4": ("absmax", "four_over_six"),
    "mxfp4": ("floor", "rceil", "quest", "quest_nearest", "floor_headroom"),
}

NVFP4 = FP4Format(name="nvfp4", block_size=16, scale_dtype=jnp.float8_e4m3fn, tensor_scale=True, scale_mode="absmax")
MXFP4 = FP4Format(name="mxfp4", block_size=32, scale_dtype=jnp.float8_e8m0fnu, tensor_scale=False, scale_mode="floor")
