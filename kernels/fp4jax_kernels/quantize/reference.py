"""XLA reference of the fused quantize: ``fp4jax.quantize`` itself, laid out as the kernels write their outputs."""

from __future__ import annotations

import dataclasses
import functools

import jax

import fp4jax
from fp4jax_kernels.quantize.spec import QuantizeSpec


@functools.partial(jax.jit, static_argnames=("spec",))
def quantize(x: jax.Array, spec: QuantizeSpec, key: jax.Array | None = None):
  """``(qtensor, dequantized)`` as ``pallas_triton.quantize`` returns them, computed by the pure-JAX quantizer.

  ``along="cols"``: ``fp4jax.quantize(x, axis=0)`` re-labelled as the QTensor of ``xᵀ`` (codes and scales
  transposed; the random bits stay those of ``x``'s indexing).
  """
  kw = spec.quantize_kwargs
  q = fp4jax.quantize(x, spec.fmt, key=key, **kw)
  deq = fp4jax.fake_quantize(x, spec.fmt, key=key, rotated=True, **kw) if spec.dequantize else None
  if spec.along == "cols":
    q = dataclasses.replace(q, codes=q.codes.T, scales=q.scales.T, shape=q.shape[::-1], axis=1)
    deq = None if deq is None else deq.T
  return q, deq
