"""Independent NumPy oracles for the formats: ml_dtypes casts (round-to-nearest-even in C, outside XLA).

``nvfp4_reference`` follows Transformer Engine's reference quantizer step by step in float32.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = np.finfo(np.float32).max


def e2m1_codes(v: np.ndarray) -> np.ndarray:
  """RNE E2M1 codes of float32 ``v`` (already clamped to ±6); exact -0.0 and x >= 0 give a clear sign bit."""
  c = np.asarray(v, F32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
  return np.where(v >= 0, c & 0x7, c).astype(np.uint8)


def e2m1_values(codes: np.ndarray) -> np.ndarray:
  mag = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], F32)[codes & 7]
  return np.where(codes & 8, -mag, mag).astype(F32)


def e4m3(x: np.ndarray) -> np.ndarray:
  with np.errstate(invalid="ignore"):  # NaN casts to E4M3's NaN, as meant; numpy flags every NaN cast
    return np.asarray(x, F32).astype(ml_dtypes.float8_e4m3fn).astype(F32)


def nvfp4_reference(x: np.ndarray):
  """TE-order NVFP4 1x16 along the last axis of a 2D float32 array (length a multiple of 16).

  Returns (codes, dec (per block, fp32), s_dec, dequantized).
  """
  x = np.asarray(x, F32)
  with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
    amax = F32(np.max(np.abs(x)))
    s_enc = F32(1.0) if amax == 0 else np.minimum(F32(2688.0) / amax, F32(FLT_MAX))
    s_dec = F32(1.0) / s_enc
    xb = x.reshape(x.shape[0], -1, 16)
    amax_b = np.max(np.abs(xb), axis=-1, keepdims=True)
    dec = e4m3(np.clip(amax_b * (s_enc * F32(1.0 / 6.0)), -448, 448))
    enc = np.minimum(F32(1.0) / (dec * s_dec), F32(FLT_MAX)).astype(F32)
    v = np.clip(xb * enc, -6, 6).astype(F32)
    codes = e2m1_codes(v)
    deq = ((e2m1_values(codes) * dec).astype(F32) * s_dec).astype(F32)
  return codes.reshape(x.shape), dec[..., 0], s_dec, deq.reshape(x.shape)
