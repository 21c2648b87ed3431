"""fp4jax: training neural networks with 4-bit floating point (NVFP4, MXFP4) in JAX.

Formats -> quantizers -> gradient estimators -> dot_general -> Flax modules; kernels plug in beneath the
quantizers and the dot (package ``fp4jax_kernels``).
"""

from fp4jax._src import bits, estimators, formats, fp8, hadamard, metrics, recipes, rounding, scaling, sharding
from fp4jax._src.dot import dot_general, einsum
from fp4jax._src.formats import MXFP4, NVFP4, FP4Format
from fp4jax._src.matmul import packed_matmul
from fp4jax._src.quantize import QTensor, fake_quantize, quantize

__version__ = "0.1.0"

__all__ = [
  "FP4Format",
  "MXFP4",
  "NVFP4",
  "QTensor",
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
  "quantize",
  "recipes",
  "rounding",
  "scaling",
  "sharding",
]
