"""Quantization-error and gradient-alignment metrics (MSE, SNR in bits, cosine, misalignment).

Public names of ``fp4jax._src.metrics`` (see there for the specifications).
"""

from fp4jax._src.metrics import (
  cosine,
  gradient_alignment,
  misalignment,
  relative_mse,
  snr_bits,
  tree_cosine,
  tree_misalignment,
)

__all__ = [
  "cosine",
  "gradient_alignment",
  "misalignment",
  "relative_mse",
  "snr_bits",
  "tree_cosine",
  "tree_misalignment",
]
