"""FP4 GEMV (CUDA cores, a few rows of A) vs the XLA path; its dispatch inside the Pallas GEMM entry."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fp4jax_kernels.gemm import api, gemv, reference

import fp4jax
from fp4jax._src import backends


def _operands(m, n, k, fmt=fp4jax.NVFP4, **rotation):
  a = fp4jax.quantize(jax.random.normal(jax.random.key(0), (m, k)) * 3.0, fmt, **rotation)
  b = fp4jax.quantize(jax.random.normal(jax.random.key(1), (n, k)), fmt, **rotation)
  return a, b


def _rel(y, r):
  return float(jnp.linalg.norm(y - r) / jnp.linalg.norm(r))


@pytest.mark.parametrize(
  "m,n,k,split_k,bk",
  [
    (1, 80, 256, None, None),
    # slow tier; default representative: [1-80-256-None-None] (the default config; split_k=1 and two rows in
    # test_gemv_word_sums_are_exact_so_integer_products_match_bit_for_bit)
    pytest.param(1, 100, 96, 1, None, marks=pytest.mark.slow),
    pytest.param(3, 40, 512, 2, 64, marks=pytest.mark.slow),
    pytest.param(8, 64, 1024, 4, None, marks=pytest.mark.slow),
    pytest.param(1, 130, 2048, None, 128, marks=pytest.mark.slow),
  ],
)
def test_gemv_matches_the_xla_path(m, n, k, split_k, bk, interpret):
  """Ragged N (rows past N masked), rows of A padded to a power of two, K of 3 chunks, split-K; fp32 order only."""
  a, b = _operands(m, n, k)
  y = gemv.matmul(a, b, out_dtype=jnp.float32, split_k=split_k, bk=bk, interpret=interpret)
  assert y.shape == (m, n) and y.dtype == jnp.float32
  assert _rel(y, reference.matmul(a, b, out_dtype=jnp.float32)) < 1e-6


# slow tier; default representative: test_gemv_matches_the_xla_path[1-80-256-None-None] (the GEMV multiplies the stored
# codes and scales alike in either domain)
@pytest.mark.slow
def test_gemv_in_the_hadamard_domain_matches(interpret):
  a, b = _operands(1, 64, 256, hadamard=16, key=jax.random.key(7))
  y = gemv.matmul(a, b, out_dtype=jnp.float32, interpret=interpret)
  assert _rel(y, reference.matmul(a, b, out_dtype=jnp.float32)) < 1e-6


def test_gemv_word_sums_are_exact_so_integer_products_match_bit_for_bit(interpret):
  """Grid values with block amax 6 (every block scale 448): every fp32 sum in the kernel is exact, so the result is
  the exact dot rounded once to fp32, times the tensor scales (alpha, rounded once)."""
  rng = np.random.default_rng(0)
  xa = rng.choice([-4.0, -2.0, -1.0, 0.0, 1.0, 2.0, 4.0, 6.0], size=(2, 512)).astype(np.float32)
  xb = rng.choice([-6.0, -3.0, -1.0, 0.0, 1.0, 3.0, 4.0], size=(64, 512)).astype(np.float32)
  xa[:, ::16], xb[:, ::16] = 6.0, 6.0
  a, b = (fp4jax.quantize(jnp.asarray(x), fp4jax.NVFP4) for x in (xa, xb))
  assert (np.asarray(a.scale_values()) == 448).all() and (np.asarray(b.scale_values()) == 448).all()
  y = gemv.matmul(a, b, out_dtype=jnp.float32, split_k=1, interpret=interpret)
  exact = (xa.astype(np.float64) @ xb.T.astype(np.float64)) * 448.0 * 448.0  # integers below 2^24 · 448²
  alpha = np.float32(np.float32(a.global_scale) * np.float32(b.global_scale))
  np.testing.assert_array_equal(np.asarray(y), exact.astype(np.float32) * alpha)


def test_gemv_propagates_a_nan_block_scale(interpret):
  a, b = _operands(1, 64, 256)
  bad = b.scales.at[5, 3].set(jnp.nan)  # row 5 of B has a NaN scale
  b = b.__class__(**{**b.__dict__, "scales": bad})
  y = np.asarray(gemv.matmul(a, b, out_dtype=jnp.float32, interpret=interpret))
  assert np.isnan(y[0, 5]) and np.isfinite(np.delete(y, 5, axis=1)).all()


def test_gemv_rejects_what_it_does_not_cover():
  a, b = _operands(1, 64, 256, fmt=fp4jax.MXFP4)
  assert not gemv.supports(a, b)
  with pytest.raises(ValueError, match="NVFP4"):
    gemv.matmul(a, b, interpret=True)
  a, b = _operands(9, 64, 256)
  assert not gemv.supports(a, b)  # more than MAX_ROWS rows of A
  a, b = _operands(1, 64, 256)
  with pytest.raises(ValueError, match="split_k"):
    gemv.matmul(a, b, split_k=3, interpret=True)
  with pytest.raises(ValueError, match="share K"):
    gemv.matmul(a, _operands(1, 64, 512)[1], interpret=True)


def _packed(m, n, k, fmt=fp4jax.NVFP4):
  """(x quantized along K (m, K), w packed along K (K, n)): ``fp4jax.packed_matmul``'s W4A4 operands."""
  x = fp4jax.quantize(jax.random.normal(jax.random.key(0), (m, k)) * 3.0, fmt)
  w = fp4jax.quantize(jax.random.normal(jax.random.key(1), (k, n)), fmt, axis=0)
  return x, w


@pytest.mark.parametrize(
  "m,n,fmt,kernel",
  [
    (1, 256, fp4jax.NVFP4, "fp4_gemv_nvfp4"),
    (2, 256, fp4jax.NVFP4, "fp4_gemv_nvfp4"),
    (3, 256, fp4jax.NVFP4, "fp4_dequant_matmul_nvfp4"),
    # slow tier; default representative: the [1-], [2-] and [3-256-...] cases (the two-row boundary) and
    # test_gemv_rejects_what_it_does_not_cover (no MXFP4 GEMV)
    pytest.param(256, 1, fp4jax.NVFP4, "fp4_dequant_matmul_nvfp4", marks=pytest.mark.slow),
    pytest.param(1, 256, fp4jax.MXFP4, "fp4_dequant_matmul_mxfp4", marks=pytest.mark.slow),
  ],
)
def test_pallas_entry_sends_up_to_two_rows_to_the_gemv(m, n, fmt, kernel, monkeypatch):
  """``api.pallas_matmul``: the GEMV for up to ``gemv.ROWS`` = 2 rows of activations (NVFP4), the tensor-core
  kernel otherwise (lowered for CUDA on any machine)."""
  monkeypatch.setattr(backends, "pallas_interpret", lambda device=None: False)
  x, w = _packed(m, n, 512, fmt=fmt)
  run = lambda x, w: api.pallas_matmul(x, w, out_dtype=jnp.bfloat16, auto=True)
  text = jax.jit(run).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
  assert kernel in text and ("fp4_gemv" in text) == (kernel == "fp4_gemv_nvfp4")


@pytest.mark.parametrize("m", [1, 5])
# slow tier; default representative: in test_packed_matmul_kernels.py, test_pallas_packed_matmul_folds_leading_dims and
# test_pallas_packed_matmul_matches_the_decoded_product[tiles] (fp4jax.packed_matmul on the kernels); this module's
# GEMV tests and test_pallas_entry_sends_up_to_two_rows_to_the_gemv (one row to the GEMV)
@pytest.mark.slow
def test_packed_matmul_on_pallas_matches_dequantize_then_dot(m):
  """``fp4jax.packed_matmul(backend="pallas")`` (interpret mode off a GPU: the GEMV for one row, the tensor-core
  kernel for five) against NumPy's float64 product of the dequantized operands: fp32 summation order only."""
  x, w = _packed(m, 48, 256)
  y = fp4jax.packed_matmul(x, w, out_dtype=jnp.float32, backend="pallas")
  want = np.asarray(x.dequantize(jnp.float32), np.float64) @ np.asarray(w.dequantize(jnp.float32), np.float64)
  assert y.shape == (m, 48) and _rel(y, want) < 1e-6


def test_gemv_sass_is_fused_multiply_adds_without_tensor_cores():
  """The developer's SASS proxy (PyPI's Triton, where installed): the K loop is fp32 FFMA, no HMMA / HGMMA."""
  pytest.importorskip("triton")
  from fp4jax_kernels import triton_ir

  a, b = _operands(1, 256, 1024)
  (module,) = triton_ir.triton_modules(lambda a, b: gemv.matmul(a, b, split_k=1), a, b)
  ops = triton_ir.sass_histogram(triton_ir.compile_sm90(module, gemv.default_config(1024)[2], 1))
  assert ops["FFMA"] >= 8 and ops["HMMA"] == 0 and ops["HGMMA"] == 0


@pytest.mark.skipif(
  jax.default_backend() != "gpu", reason="randomized larger shapes: GPU only (interpret mode is slow)"
)
@pytest.mark.parametrize("seed", range(3))
def test_gemv_randomized_shapes_on_gpu(seed):
  """Random rows of A (1-8), N and K, default config and split-K, through the Pallas entry too."""
  rng = np.random.default_rng(seed)
  m, n, k = int(rng.integers(1, gemv.MAX_ROWS + 1)), int(rng.integers(1, 3000)), 32 * int(rng.integers(1, 200))
  a, b = _operands(m, n, k)
  want = reference.matmul(a, b, out_dtype=jnp.float32)
  assert _rel(gemv.matmul(a, b, out_dtype=jnp.float32), want) < 1e-6
  x = fp4jax.quantize(jax.random.normal(jax.random.key(0), (m, k)) * 3.0, fp4jax.NVFP4)
  w = fp4jax.quantize(jax.random.normal(jax.random.key(1), (k, n)), fp4jax.NVFP4, axis=0)
  want = np.asarray(x.dequantize(jnp.float32), np.float64) @ np.asarray(w.dequantize(jnp.float32), np.float64)
  assert _rel(fp4jax.packed_matmul(x, w, out_dtype=jnp.float32, backend="pallas"), want) < 1e-6
