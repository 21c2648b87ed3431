"""XLA reference of the fused quantize: ``fp4jax.quantize`` itself, laid out as the kernels write their outputs."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from fp4jax._src import estimators
from fp4jax._src import hadamard as hadamard_lib
from fp4jax._src.quantize import BlockLayout, QTensor, fake_quantize
from fp4jax._src.quantize import quantize as quantize_xla
from fp4jax_kernels.quantize.spec import Quantized, QuantizeSpec


def _trust_mask(x: jax.Array, q: QTensor) -> jax.Array:
  """``estimators.trust_mask(x̂, dec_b · s_dec)`` as uint8, ``x̂`` = ``x`` rotated as ``q`` was (bf16-rounded)."""
  xr = hadamard_lib.rotated(x, q.hadamard, axis=q.axis, signs=q.signs) if q.hadamard else x.astype(jnp.float32)
  lay = BlockLayout(q.shape, q.axis, q.block_shape)
  dec = lay.scales_to_blocks(q.scale_values())
  mask = estimators.trust_mask(lay.to_blocks(xr), dec * q.global_scale)
  return lay.from_blocks(mask).astype(jnp.uint8)


@functools.partial(jax.jit, static_argnames=("spec",))
def quantize(
  x: jax.Array, spec: QuantizeSpec, key: jax.Array | None = None, *, signs: jax.Array | None = None
) -> Quantized:
  """``Quantized`` as ``pallas_triton.quantize`` returns it, computed by the pure-JAX quantizer.

  ``along="cols"``: ``fp4jax.quantize(x, axis=0)`` re-labelled as the QTensor of ``xᵀ`` (codes and scales
  transposed; the random bits stay those of ``x``'s indexing). ``along="rows_of_transpose"``:
  ``fp4jax.quantize(x.T)``. Explicit ``signs``: ``x ⊙ s`` per Hadamard chunk quantized with no signs
  (``fp4jax.hadamard`` multiplies by the signs before its butterflies; ±1 products are exact in any dtype).
  """
  kw = spec.quantize_kwargs
  if spec.along == "rows_of_transpose":
    x = x.T
  if signs is not None:
    spec.check_signs(signs)
    s = jnp.tile(jnp.asarray(signs, x.dtype), x.shape[kw["axis"]] // spec.hadamard)
    x = x * (s if kw["axis"] == -1 else s[:, None])
    kw = {**kw, "hadamard_signs": "none"}
  q = quantize_xla(x, spec.fmt, key=key, **kw)
  deq = None
  if spec.dequantize == "with_tensor_scale":
    deq = fake_quantize(x, spec.fmt, key=key, rotated=True, **kw)
  elif spec.dequantize == "block_scaled_only":
    deq = dataclasses.replace(q, global_scale=jnp.float32(1.0)).dequantize(jnp.bfloat16, rotated=True)
  mask = _trust_mask(x, q) if spec.trust_mask else None  # x already carries the explicit signs
  if signs is not None:
    q = dataclasses.replace(q, signs=jnp.asarray(signs, jnp.float32))
  if spec.along == "cols":
    q = dataclasses.replace(q, codes=q.codes.T, scales=q.scales.T, shape=q.shape[::-1], axis=1)
    deq = None if deq is None else deq.T
    mask = None if mask is None else mask.T
  return Quantized(q if spec.packed else None, deq, mask, q.global_scale)


def quantize_pair(
  x: jax.Array,
  rows: QuantizeSpec,
  cols: QuantizeSpec,
  rows_key: jax.Array | None = None,
  cols_key: jax.Array | None = None,
  *,
  rows_signs: jax.Array | None = None,
  cols_signs: jax.Array | None = None,
) -> tuple[Quantized, Quantized]:
  """``pallas_triton.quantize_pair``'s two results, by two calls of ``quantize``."""
  return quantize(x, rows, rows_key, signs=rows_signs), quantize(x, cols, cols_key, signs=cols_signs)
