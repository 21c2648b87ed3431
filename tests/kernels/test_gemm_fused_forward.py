"""Fused forward GEMM (activations quantized inside the GEMM) vs quantize-then-dequantize-dot."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from fp4jax_kernels.contrib import fused_forward
from fp4jax_kernels.gemm import reference

import fp4jax
from fp4jax._src import hadamard as hadamard_lib

FOUR_OVER_SIX = dataclasses.replace(fp4jax.NVFP4, scale_mode="four_over_six")


def _rel(y, r):
  return float(jnp.linalg.norm(y - r) / jnp.linalg.norm(r))


@pytest.mark.parametrize(
  "fmt,hadamard,dtype",
  [
    # slow tier; default representative: [rht16] (the in-kernel quantization with the Hadamard; the cheapest case)
    pytest.param(fp4jax.NVFP4, 0, jnp.float32, marks=pytest.mark.slow),
    pytest.param(FOUR_OVER_SIX, 0, jnp.bfloat16, marks=pytest.mark.slow),
    (fp4jax.NVFP4, 16, jnp.bfloat16),
  ],
  ids=["rtn", "4over6_bf16", "rht16"],
)
def test_fused_forward_matches_quantize_then_dot(fmt, hadamard, dtype, interpret):
  # X quantized in the kernel must be fp4jax.quantize's X bit for bit: one wrong code moves the result by ~1e-3
  # relative, far above the ~1e-7 of fp32 summation order that the tolerance allows.
  x = (jax.random.normal(jax.random.key(0), (32, 96)) * 3.0).astype(dtype)
  wx = jax.random.normal(jax.random.key(1), (48, 96))
  kw = dict(hadamard=hadamard or None, hadamard_signs="te" if hadamard else "none")
  w = fp4jax.quantize(wx, fmt, **kw)
  signs = jnp.asarray(hadamard_lib.TE_SIGNS_16) if hadamard else None
  y = fused_forward.matmul(
    x,
    w,
    fmt=fmt,
    hadamard=hadamard,
    signs=signs,
    tile=(16, 16, 32),
    out_dtype=jnp.float32,
    num_warps=4,
    interpret=interpret,
  )
  want = reference.matmul(fp4jax.quantize(x, fmt, **kw), w, out_dtype=jnp.float32)
  assert y.shape == (32, 48) and _rel(y, want) < 1e-6
  if not hadamard:  # negative control: the same GEMM on unquantized X is far off at that tolerance
    assert _rel(jnp.dot(x.astype(jnp.float32), w.dequantize(jnp.float32).T), want) > 1e-3


def test_fused_forward_nan_input_gives_nan(interpret):
  x = jnp.ones((16, 32)).at[3, 5].set(jnp.nan)
  w = fp4jax.quantize(jnp.ones((16, 32)), fp4jax.NVFP4)
  y = fused_forward.matmul(
    x, w, fmt=fp4jax.NVFP4, tile=(16, 16, 32), out_dtype=jnp.float32, num_warps=4, interpret=interpret
  )
  assert bool(jnp.all(jnp.isnan(y)))  # the tensor scale is NaN, as fp4jax.quantize's


@pytest.mark.parametrize(
  "change,match",
  [(dict(tile=(16, 16, 24)), "tile"), (dict(hadamard=16), "Hadamard"), (dict(fmt=fp4jax.MXFP4), "NVFP4")],
)
def test_fused_forward_rejects_bad_arguments(change, match):
  x = jnp.ones((16, 48))
  w = fp4jax.quantize(jnp.ones((16, 48)), fp4jax.NVFP4)
  args = dict(fmt=fp4jax.NVFP4, tile=(16, 16, 16)) | change
  with pytest.raises(ValueError, match=match):
    fused_forward.matmul(x, w, interpret=True, **args)


def test_fused_forward_lowers_to_triton():
  x = jnp.ones((256, 256), jnp.bfloat16)
  w = fp4jax.quantize(jnp.ones((256, 256)), fp4jax.NVFP4, hadamard=16, hadamard_signs="te")
  signs = jnp.asarray(hadamard_lib.TE_SIGNS_16)
  text = (
    jax.jit(lambda x, w, s: fused_forward.matmul(x, w, fmt=fp4jax.NVFP4, hadamard=16, signs=s))
    .trace(x, w, signs)
    .lower(lowering_platforms=("cuda",))
    .as_text()
  )
  assert "fp4_fused_forward_nvfp4" in text
