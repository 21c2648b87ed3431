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
from fp4jax._src.spec import QuantizeSpec
from fp4jax_kernels.quantize.output import KernelOutput, Quantized, check, check_signs


def _trust_mask(x: jax.Array, q: QTensor) -> jax.Array:
  """``estimators.trust_mask(x̂, dec_b · s_dec)`` as uint8, ``x̂`` = ``x`` rotated as ``q`` was (bf16-rounded)."""
  xr = hadamard_lib.rotated(x, q.hadamard, axis=q.axis, signs=q.signs) if q.hadamard else x.astype(jnp.float32)
  lay = BlockLayout(q.shape, q.axis, q.block_shape)
  dec = lay.scales_to_blocks(q.scale_values())
  mask = estimators.trust_mask(lay.to_blocks(xr), dec * q.global_scale)
  return lay.from_blocks(mask).astype(jnp.uint8)


@functools.partial(jax.jit, static_argnames=("spec", "output"))
def quantize(
  x: jax.Array,
  spec: QuantizeSpec,
  key: jax.Array | None = None,
  *,
  output: KernelOutput = KernelOutput(),  # noqa: B008 (frozen)
  signs: jax.Array | None = None,
) -> Quantized:
  """``Quantized`` as ``pallas_triton.quantize`` returns it, computed by the pure-JAX quantizer.

  ``along="cols"``: ``fp4jax.quantize(x, spec, axis=0)`` re-labelled as the QTensor of ``xᵀ`` (codes and scales
  transposed; the random bits stay those of ``x``'s indexing). ``along="rows_of_transpose"``:
  ``fp4jax.quantize(x.T, spec)``. Explicit ``signs``: ``x ⊙ s`` per Hadamard chunk quantized with no signs
  (``fp4jax.hadamard`` multiplies by the signs before its butterflies; ±1 products are exact in any dtype).
  """
  check(spec, output)
  axis = 0 if output.along == "cols" else -1
  if output.along == "rows_of_transpose":
    x = x.T
  if signs is not None:
    check_signs(spec, signs)
    s = jnp.tile(jnp.asarray(signs, x.dtype), x.shape[axis] // spec.hadamard)
    x = x * (s if axis == -1 else s[:, None])
    spec = dataclasses.replace(spec, signs="none")
  q = quantize_xla(x, spec, key=key, axis=axis)
  deq = None
  if output.dequantize == "with_tensor_scale":
    deq = fake_quantize(x, spec, key=key, axis=axis, rotated=True)
  elif output.dequantize == "block_scaled_only":
    deq = dataclasses.replace(q, global_scale=jnp.float32(1.0)).dequantize(jnp.bfloat16, rotated=True)
  mask = _trust_mask(x, q) if output.trust_mask else None  # x already carries the explicit signs
  if signs is not None:
    q = dataclasses.replace(q, signs=jnp.asarray(signs, jnp.float32))
  if output.along == "cols":
    q = dataclasses.replace(q, codes=q.codes.T, scales=q.scales.T, shape=q.shape[::-1], axis=1)
    deq = None if deq is None else deq.T
    mask = None if mask is None else mask.T
  return Quantized(q if output.packed else None, deq, mask, q.global_scale)


def quantize_pair(
  x: jax.Array,
  rows: QuantizeSpec,
  cols: QuantizeSpec,
  rows_key: jax.Array | None = None,
  cols_key: jax.Array | None = None,
  *,
  rows_output: KernelOutput,
  cols_output: KernelOutput,
  rows_signs: jax.Array | None = None,
  cols_signs: jax.Array | None = None,
) -> tuple[Quantized, Quantized]:
  """``pallas_triton.quantize_pair``'s two results, by two calls of ``quantize``."""
  return (
    quantize(x, rows, rows_key, output=rows_output, signs=rows_signs),
    quantize(x, cols, cols_key, output=cols_output, signs=cols_signs),
  )
