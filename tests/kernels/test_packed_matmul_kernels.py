"""``fp4jax.packed_matmul`` through the kernels' implementations (``fp4jax_kernels.gemm.api``; Pallas interpret
mode off a GPU) against NumPy decodes of the packed codes, and ``"auto"``'s choice between them and XLA."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fp4jax_kernels.gemm import api

import fp4jax
from fp4jax._src import backends

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def np_decode(q):
  """NumPy float64 values of a 2-D QTensor in its stored (rotated) domain, (K, N) along axis 0 or (M, K) along axis
  1, 1-D blocks or 16x16 tiles: E2M1 code (low nibble = even element) · its block's scale · the tensor scale."""
  codes, scales = np.asarray(q.codes).astype(np.int64), np.asarray(q.scale_values(), np.float64)
  if q.axis == 1:
    codes, scales = codes.T, scales.T  # K first
  nib = np.stack([codes & 0xF, codes >> 4], axis=1).reshape(2 * codes.shape[0], codes.shape[1])
  vals = np.where(nib & 8, -1.0, 1.0) * E2M1[nib & 7]
  tile = q.block_shape[-1]
  scales = np.repeat(scales, tile, axis=0)
  if len(q.block_shape) == 2:
    scales = np.repeat(scales, q.block_shape[0], axis=1)
  out = vals * scales[: vals.shape[0], : vals.shape[1]] * float(q.global_scale)
  return out if q.axis == 0 else out.T


def _rel(y, want):
  return float(np.linalg.norm(np.asarray(y, np.float64) - want) / np.linalg.norm(want))


@pytest.mark.parametrize(
  "m,fmt,extra",
  [
    # slow tier; default representative: [tiles] and test_pallas_packed_matmul_folds_leading_dims (1D blocks) through
    # the tensor-core kernel, the GEMV by test_gemm_gemv.py's tests and its entry's dispatch
    pytest.param(1, fp4jax.NVFP4, {}, marks=pytest.mark.slow),  # the GEMV
    (5, fp4jax.NVFP4, {"block_shape": (16, 16)}),  # NVIDIA's 16x16 weight tiles, the tensor-core kernel
    # Quartet: MXFP4 in a 32-point Hadamard domain
    pytest.param(3, fp4jax.MXFP4, {"hadamard": 32, "hadamard_signs": "none"}, marks=pytest.mark.slow),
  ],
  ids=["gemv", "tiles", "mxfp4-hadamard"],
)
def test_pallas_packed_matmul_matches_the_decoded_product(m, fmt, extra):
  w = fp4jax.quantize(jax.random.normal(jax.random.key(1), (128, 40)), fmt, axis=0, **extra)
  act = {"hadamard": None, **{k: v for k, v in extra.items() if k != "block_shape"}}
  x = fp4jax.quantize(jax.random.normal(jax.random.key(0), (m, 128)) * 3.0, fmt, **act)
  y = fp4jax.packed_matmul(x, w, out_dtype=jnp.float32, backend="pallas")
  assert y.shape == (m, 40) and _rel(y, np_decode(x) @ np_decode(w)) < 1e-6


def test_pallas_packed_matmul_folds_leading_dims():
  w = fp4jax.quantize(jax.random.normal(jax.random.key(1), (64, 24)), fp4jax.NVFP4, axis=0)
  x = fp4jax.quantize(jax.random.normal(jax.random.key(0), (2, 3, 64)), fp4jax.NVFP4)
  y = fp4jax.packed_matmul(x, w, out_dtype=jnp.float32, backend="pallas")
  want = np.einsum("bmk,kn->bmn", np.asarray(x.dequantize(jnp.float32), np.float64), np_decode(w))
  assert y.shape == (2, 3, 24) and _rel(y, want) < 1e-6


# slow tier; default representative: test_pallas_packed_matmul_matches_the_decoded_product[tiles] (16x16 weight tiles
# laid out K-major for the tensor-core kernel, its product against the NumPy decode)
@pytest.mark.slow
def test_k_major_is_the_same_codes_and_scales_laid_out_again():
  w = fp4jax.quantize(jax.random.normal(jax.random.key(1), (64, 40)), fp4jax.NVFP4, axis=0, block_shape=(16, 16))
  b = api.k_major(w)
  assert b.shape == (40, 64) and b.axis == 1 and b.block_shape == (16,)
  np.testing.assert_array_equal(np_decode(b), np_decode(w).T)


def test_kernels_refuse_weight_only_and_named_backends_say_so():
  w = fp4jax.quantize(jnp.ones((64, 24)), fp4jax.NVFP4, axis=0)
  for backend in ("pallas", "native"):
    with pytest.raises(backends.Unsupported, match="x is not quantized"):
      fp4jax.packed_matmul(jnp.ones((2, 64)), w, backend=backend)
  x = fp4jax.quantize(jnp.ones((2, 64)), fp4jax.MXFP4)
  with pytest.raises(backends.Unsupported, match="one format"):
    fp4jax.packed_matmul(x, w, backend="pallas")
  nv32 = dataclasses.replace(fp4jax.NVFP4, block_size=32)  # the GEMV would read 16-blocks
  w32, x32 = fp4jax.quantize(jnp.ones((64, 24)), nv32, axis=0), fp4jax.quantize(jnp.ones((1, 64)), nv32)
  with pytest.raises(backends.Unsupported, match="32-element blocks"):
    fp4jax.packed_matmul(x32, w32, backend="pallas")


# slow tier; default representative: test_kernels_refuse_weight_only_and_named_backends_say_so (the refusals "auto"
# falls back on), test_gemm_native.py::test_auto_tries_what_the_device_runs_fastest_first (its order on each device)
@pytest.mark.slow
def test_auto_on_a_gpu_takes_the_kernel_for_fp4_activations_and_xla_otherwise(monkeypatch):
  """``"auto"`` on an H100 (faked): the Pallas kernel for quantized activations and K a whole number of blocks; XLA
  for an array x (weight-only) and for a ragged K."""
  monkeypatch.setattr(backends, "has_pallas_triton", lambda device=None: True)
  q = lambda shape, **kw: fp4jax.quantize(jnp.ones(shape, jnp.float32), fp4jax.NVFP4, **kw)
  on_kernel = lambda x, w: "pallas_call" in str(jax.make_jaxpr(lambda x, w: fp4jax.packed_matmul(x, w))(x, w))
  assert on_kernel(q((4, 256)), q((256, 32), axis=0)) and on_kernel(q((1, 256)), q((256, 32), axis=0))
  assert not on_kernel(jnp.ones((4, 256)), q((256, 32), axis=0))
  assert not on_kernel(q((4, 250)), q((250, 32), axis=0))


# slow tier; default representative: test_gemm_native.py::test_native_matmul_lowers_for_cuda (the scaled_matmul
# lowering this entry calls)
@pytest.mark.slow
def test_native_packed_matmul_lowers_for_cuda():
  w = fp4jax.quantize(jax.random.normal(jax.random.key(1), (128, 128)), fp4jax.NVFP4, axis=0)
  x = fp4jax.quantize(jax.random.normal(jax.random.key(0), (128, 128)), fp4jax.NVFP4)
  run = lambda x, w: api.native_matmul(x, w, out_dtype=jnp.bfloat16, auto=True)
  text = jax.jit(run).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
  assert "scaled_matmul" in text or "block_scaled" in text
