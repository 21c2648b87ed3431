"""FP8 with per-tensor current scaling (E4M3 for activations/weights, E5M2 for gradients): the common FP8 baseline.

Current scaling (Transformer Engine's ``Float8CurrentScaling``, margin 0), all fp32:

    amax = max|x|;   s = f8_max / amax   (s = 1 when amax == 0; NaN when amax is not finite);
    optionally s = 2^floor(log2 s) (power-of-two scale);   v = rne_f8(clamp(x · s, ±f8_max));   x ≈ v / s

``v`` lies on the FP8 grid (3 resp. 2 mantissa bits), so it is exact in bfloat16 and a GEMM can consume it at bf16
with the two tensors' ``1/s`` applied in the epilogue. Rounding is explicit arithmetic (never ``astype``): on GPU XLA
removes convert pairs under ``jit``; scale divisions use ``fp4jax.ieee.div_rn`` (GPU fp32 division is not correctly
rounded), so CPU and GPU agree bit for bit. Formats (OCP FP8): E4M3 (``float8_e4m3fn``) max 448, subnormal step 2^-9;
E5M2 max 57344, subnormal step 2^-16. Ties go to even.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp4jax._src.formats import E4M3, E5M2, FP8Format, floor_log2, pow2
from fp4jax._src.ieee import div_rn, widen

__all__ = ["E4M3", "E5M2", "FP8Format", "current_scale", "quantize_fp8", "rtn_e5m2"]


def rtn_e5m2(x: jnp.ndarray) -> jnp.ndarray:
  """Float32 ``x`` rounded to the E5M2 grid, nearest-even, saturated to ±57344 (``E5M2.round``). NaN stays NaN.

  Args:
    x: float array, any shape.

  Returns:
    float32 array of ``x``'s shape whose values lie on the E5M2 grid (or are NaN).
  """
  return E5M2.round(x)


def current_scale(x: jax.Array, fmt: FP8Format, *, pow2_scale: bool = False, amax=None) -> jnp.ndarray:
  """fp32 encode scale ``s = f8_max / max|x|`` (1 if the tensor is zero, NaN if its amax is not finite).

  The division is correctly rounded (``fp4jax.ieee.div_rn``); with ``pow2_scale``, ``s = 2^floor(log2 s)``.

  Args:
    x: the tensor, any shape and float dtype.
    fmt: the FP8 format (``E4M3`` or ``E5M2``); its ``max`` is ``f8_max``.
    pow2_scale: round the scale down to a power of two.
    amax: max|x| computed elsewhere (e.g. over the shards of a larger tensor, ``fp4jax.sharding``); None computes it
      from ``x``.

  Returns:
    float32 scalar: the encode scale.
  """
  amax = jnp.max(jnp.abs(widen(x))) if amax is None else jnp.asarray(amax, jnp.float32)
  s = div_rn(jnp.float32(fmt.max), jnp.where(amax == 0, jnp.float32(fmt.max), amax))
  if pow2_scale:
    s = pow2(floor_log2(s))
  return jnp.where(jnp.isfinite(amax), s, jnp.float32(jnp.nan))


def quantize_fp8(
  x: jax.Array, fmt: FP8Format, *, pow2_scale: bool = False, amax=None
) -> tuple[jnp.ndarray, jnp.ndarray]:
  """``(v, inv_scale)``: float32 values ``v`` on the FP8 grid and the fp32 decode scale, ``x ≈ v · inv_scale``.

  ``v = fmt.round(f32(x) · s)`` with ``s = current_scale(x, fmt, ...)`` and ``inv_scale = 1 / s`` (correctly
  rounded).

  Args:
    x: floating-point array, any shape.
    fmt: ``fp4jax.fp8.E4M3`` or ``E5M2``.
    pow2_scale: use a power-of-two scale (see ``current_scale``).
    amax: max|x| computed elsewhere (see ``current_scale``).

  Returns:
    ``(v, inv_scale)``: float32 array of ``x``'s shape and float32 scalar.

  Raises:
    TypeError: ``fmt`` not an ``FP8Format`` (``fp4jax.fp8.E4M3`` / ``E5M2``), or ``x`` not floating point.
  """
  if not isinstance(fmt, FP8Format):
    raise TypeError(f"fmt must be an FP8Format such as fp4jax.fp8.E4M3 or fp4jax.fp8.E5M2, got {fmt!r}")
  if not jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating):
    raise TypeError(f"x must be a floating-point array, got dtype {jnp.asarray(x).dtype}")
  s = current_scale(x, fmt, pow2_scale=pow2_scale, amax=amax)
  v = fmt.round(widen(x) * s)
  return v, div_rn(jnp.float32(1.0), s)
