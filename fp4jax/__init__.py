"""fp4jax: training neural networks with 4-bit floating point (NVFP4, MXFP4) in JAX.

Formats -> quantizers -> gradient estimators -> dot_general -> Flax modules (``fp4jax.flax``); kernels plug in
beneath the quantizers and the GEMM through ``fp4jax.backends`` (package ``fp4jax_kernels``). The implementation
lives in ``fp4jax._src``; what is listed in ``__all__`` here and in the public submodules is the API.
"""

from fp4jax import (
  backends,
  bits,
  estimators,
  formats,
  fp8,
  hadamard,
  metrics,
  recipes,
  rounding,
  scaling,
  sharding,
)
from fp4jax._src.backends import Backend
from fp4jax._src.dot import PrequantizedWeight, dot_general, einsum, prequantize_refusal, prequantize_weight
from fp4jax._src.formats import (
  E2M1_CHANNEL,
  E4M3,
  E5M2,
  FP8_BLOCK,
  MXFP4,
  MXFP8,
  NVFP4,
  BlockFormat,
  BlockFP8Format,
  E2M1ChannelFormat,
  Format,
  FP4Format,
  FP8BlockFormat,
  FP8Format,
  MXFP4Format,
  MXFP8Format,
  NVFP4Format,
)
from fp4jax._src.matmul import packed_matmul
from fp4jax._src.quantize import QTensor, fake_quantize, quantize
from fp4jax._src.ragged import ragged_dot
from fp4jax._src.spec import QuantizeSpec

__version__ = "0.1.0"

__all__ = [
  "E2M1_CHANNEL",
  "E4M3",
  "E5M2",
  "FP8_BLOCK",
  "MXFP4",
  "MXFP8",
  "NVFP4",
  "Backend",
  "BlockFP8Format",
  "BlockFormat",
  "E2M1ChannelFormat",
  "FP4Format",
  "FP8BlockFormat",
  "FP8Format",
  "Format",
  "MXFP4Format",
  "MXFP8Format",
  "NVFP4Format",
  "PrequantizedWeight",
  "QTensor",
  "QuantizeSpec",
  "backends",
  "bits",
  "dot_general",
  "einsum",
  "estimators",
  "fake_quantize",
  "formats",
  "fp8",
  "hadamard",
  "metrics",
  "packed_matmul",
  "prequantize_refusal",
  "prequantize_weight",
  "quantize",
  "ragged_dot",
  "recipes",
  "rounding",
  "scaling",
  "sharding",
]
