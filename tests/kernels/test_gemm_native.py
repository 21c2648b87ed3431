"""FP4 GEMM (Pallas dequantize-in-kernel, native scaled_matmul operands) vs the XLA path; scale swizzle; dispatch."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fp4jax_kernels.gemm import pallas_triton, reference
from fp4jax_kernels.native import matmul as native

import fp4jax
from fp4jax._src import backends
from fp4jax._src.formats import E2M1_VALUES


def _operands(fmt, m=48, n=40, k=128):
  a = fp4jax.quantize(jax.random.normal(jax.random.key(0), (m, k)) * 3.0, fmt)
  b = fp4jax.quantize(jax.random.normal(jax.random.key(1), (n, k)), fmt)
  return a, b


def _rel(y, r):
  return float(jnp.linalg.norm(y - r) / jnp.linalg.norm(r))


def test_in_kernel_decoders_give_every_e2m1_value_and_exact_scaled_products():
  codes = jnp.arange(16, dtype=jnp.uint8)
  want = np.concatenate([E2M1_VALUES, -E2M1_VALUES])
  for decode in (pallas_triton.e2m1_to_f16, pallas_triton.e2m1_to_bf16):
    got = np.asarray(decode(codes), np.float32)
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.arange(16) >= 8)  # code 8 is -0.0
  # NVFP4 operands are float16 value·scale: exact for every code and every finite E4M3 scale (0x7F is NaN)
  bits = jnp.arange(127, dtype=jnp.uint8)
  scales = np.asarray(fp4jax.NVFP4.decode_scale_bits(bits), np.float64)
  np.testing.assert_array_equal(scales, np.asarray(jax.lax.bitcast_convert_type(bits, jnp.float8_e4m3fn), np.float64))
  even, odd = pallas_triton.dequant_halves(
    jnp.tile(codes[None, :8] | (codes[None, 8:] << 4), (127, 1)), bits[:, None], 16, fp4jax.NVFP4
  )
  assert even.dtype == jnp.float16
  np.testing.assert_array_equal(np.asarray(even, np.float64), E2M1_VALUES[None, :] * scales[:, None])
  np.testing.assert_array_equal(np.asarray(odd, np.float64), -E2M1_VALUES[None, :] * scales[:, None])
  assert np.isnan(
    np.asarray(
      pallas_triton.dequant_halves(codes[None, :8], jnp.full((1, 1), 0x7F, jnp.uint8), 16, fp4jax.NVFP4)[0], np.float32
    )
  ).all()


def test_word_decoder_gives_every_element_times_every_scale_exactly():
  """NVFP4 code words: element e of each uint32 word is value · scale · 2^-7 in float16, exact for every code at every
  position and every E4M3 scale (subnormal scales and float16-subnormal products included); 0x7F gives NaN."""
  rng = np.random.default_rng(0)
  layouts = np.stack([rng.permutation(16) for _ in range(8)])  # (8 positions, 16 rows): every code at every position
  row_codes = layouts.T  # (16, 8): row r has code layouts[e, r] at element e
  packed = (row_codes[:, 0::2] | (row_codes[:, 1::2] << 4)).astype(np.uint8)  # (16, 4): one word per row
  words = pallas_triton.code_words(jnp.asarray(np.tile(packed, (1, 2))))  # (16, 2): a 16-block = 2 words
  assert words.dtype == jnp.uint32 and words.shape == (16, 2)
  value = np.concatenate([E2M1_VALUES, -E2M1_VALUES])
  bits = np.arange(128, dtype=np.uint8)
  scale = np.asarray(jax.lax.bitcast_convert_type(jnp.asarray(bits), jnp.float8_e4m3fn), np.float64)
  for b in bits:
    parts = pallas_triton.dequant_words(words, jnp.full((16, 1), b, jnp.uint8))
    assert len(parts) == 8 and all(p.dtype == jnp.float16 and p.shape == (16, 2) for p in parts)
    got = np.stack([np.asarray(p, np.float64) for p in parts], axis=-1)  # (16, 2 words, 8 elements)
    if b == 0x7F:
      assert np.isnan(got).all()
      continue
    want = value[row_codes][:, None, :] * scale[b] * 2.0**-pallas_triton.WORD_SCALE_EXP
    np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape))
    np.testing.assert_array_equal(np.signbit(got), np.broadcast_to((row_codes >= 8)[:, None, :], got.shape))


@pytest.mark.parametrize(
  "fmt",
  # slow tier; default representative: [mxfp4] here, NVFP4 by test_pallas_gemm_split_k_matches[2] and
  # test_pallas_gemm_swapped_product_matches[5] (the same comparison, other tiles)
  [pytest.param(fp4jax.NVFP4, marks=pytest.mark.slow), fp4jax.MXFP4],
  ids=lambda f: f.name,
)
def test_pallas_gemm_matches_dequantize_dot(fmt, interpret):
  # Products value·scale are exact in the operand dtype (float16 / bfloat16); only fp32 summation order and the
  # epilogue alpha differ (~1 ulp).
  a, b = _operands(fmt)
  y = pallas_triton.matmul(a, b, tile=(32, 32, 64), out_dtype=jnp.float32, num_warps=4, interpret=interpret)
  assert y.shape == (48, 40)
  assert _rel(y, reference.matmul(a, b, out_dtype=jnp.float32)) < 1e-6


@pytest.mark.parametrize(
  "fmt,dots",
  [(fp4jax.NVFP4, 1), (fp4jax.NVFP4, 2), (fp4jax.NVFP4, 4), (fp4jax.NVFP4, 8), (fp4jax.MXFP4, 2)],
  ids=lambda v: getattr(v, "name", v),
)
# slow tier; default representative: test_pallas_gemm_split_k_matches[2] (NVFP4, one dot per chunk: skinny tiles),
# test_pallas_gemm_swapped_product_matches[5] (two: 64-row tiles), test_pallas_gemm_matches_dequantize_dot[mxfp4]
# (MXFP4's two halves) and test_word_decoder_gives_every_element_times_every_scale_exactly (the 8 parts, exactly)
@pytest.mark.slow
def test_pallas_gemm_every_dot_split_matches(fmt, dots, interpret):
  """The decoded parts joined into 1, 2, 4 or 8 dots per K chunk: the same sums in another order."""
  a, b = _operands(fmt, k=256)
  y = pallas_triton.matmul(a, b, tile=(16, 32, 128), out_dtype=jnp.float32, num_warps=4, interpret=interpret, dots=dots)
  assert _rel(y, reference.matmul(a, b, out_dtype=jnp.float32)) < 1e-6


def test_pallas_gemm_rejects_mismatched_operands():
  a, _ = _operands(fp4jax.NVFP4)
  _, b = _operands(fp4jax.MXFP4)
  with pytest.raises(ValueError, match="share format"):
    pallas_triton.matmul(a, b, tile=(16, 16, 64), interpret=True)
  for dots, tile in ((3, (16, 16, 128)), (8, (16, 16, 64))):
    with pytest.raises(ValueError, match="dots"):
      pallas_triton.matmul(a, _operands(fp4jax.NVFP4)[1], tile=tile, dots=dots, interpret=True)
  with pytest.raises(ValueError, match="dots"):
    pallas_triton.matmul(_operands(fp4jax.MXFP4)[0], b, tile=(16, 16, 64), dots=4, interpret=True)


def _emulate(a, b):
  """``native.matmul`` with ``jax.nn.scaled_matmul`` replaced by its documented definition (scales repeated over
  their blocks, then an einsum), in NumPy float64."""
  lhs, rhs, ls, rs = (np.asarray(t.astype(jnp.float32), np.float64) for t in native.operands(a, b))
  up = lambda v, s: v * np.repeat(s, v.shape[-1] // s.shape[-1], axis=-1)
  out = np.einsum("bmk,bnk->bmn", up(lhs, ls), up(rhs, rs))[0]
  return jnp.asarray(out * float(a.global_scale) * float(b.global_scale), jnp.float32)


@pytest.mark.parametrize("fmt", [fp4jax.NVFP4, fp4jax.MXFP4], ids=lambda f: f.name)
def test_native_operands_reproduce_the_reference(fmt):
  a, b = _operands(fmt)
  lhs, _, ls, _ = native.operands(a, b)
  assert lhs.dtype == jnp.float4_e2m1fn and ls.dtype == fmt.scale_dtype and ls.shape == (1, 48, 128 // fmt.block_size)
  assert _rel(_emulate(a, b), reference.matmul(a, b, out_dtype=jnp.float32)) < 1e-6


def test_native_matmul_lowers_for_cuda():
  a, b = _operands(fp4jax.NVFP4, m=128, n=128, k=128)
  text = jax.jit(native.matmul).trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
  assert "scaled_matmul" in text or "block_scaled" in text


def _device(platform, cc=None):
  return types.SimpleNamespace(platform=platform, compute_capability=cc)


@pytest.mark.parametrize(
  "dev, want",
  [
    (_device("cpu"), ("xla",)),
    (_device("gpu", "9.0"), ("pallas", "xla")),
    (_device("gpu", "10.0"), ("native", "pallas", "xla")),
    (_device("gpu", "12.0"), ("native", "pallas", "xla")),
    (_device("gpu", "7.5"), ("xla",)),
  ],
)
def test_auto_tries_what_the_device_runs_fastest_first(dev, want):
  assert backends.candidates("auto", dev) == want
  assert backends.candidates("pallas", dev) == ("pallas",)


@pytest.mark.parametrize(
  "m,k,want",
  [
    (1, 256, ((16, 64, 128), 4, 4)),
    (16, 96, ((16, 64, 32), 4, 4)),
    (48, 64, ((64, 128, 64), 4, 4)),
    (4096, 4096, ((128, 128, 128), 8, 3)),
  ],
)
def test_pallas_gemm_default_config_fits_skinny_gemms(m, k, want):
  assert pallas_triton.default_config(m, k) == want


# slow tier; default representative: test_pallas_gemm_swapped_product_matches[5] (m=5 with the default config)
@pytest.mark.slow
def test_pallas_gemm_skinny_default_tile_matches(interpret):
  a, b = _operands(fp4jax.NVFP4, m=5, n=24, k=64)
  y = pallas_triton.matmul(a, b, out_dtype=jnp.float32, num_warps=4, interpret=interpret)
  assert y.shape == (5, 24) and _rel(y, reference.matmul(a, b, out_dtype=jnp.float32)) < 1e-6


@pytest.mark.parametrize(
  "m",
  # slow tier; default representative: [5] (a few ragged rows, every swap setting)
  [pytest.param(1, marks=pytest.mark.slow), 5, pytest.param(32, marks=pytest.mark.slow)],
)
def test_pallas_gemm_swapped_product_matches(m, interpret):
  """A few rows of A: by default the kernel computes (dq(B)·dq(A)ᵀ)ᵀ, B's rows in the tiles; the same sums."""
  a, b = _operands(fp4jax.NVFP4, m=m, n=80, k=256)
  want = reference.matmul(a, b, out_dtype=jnp.float32)
  for swap in (None, True, False):
    y = pallas_triton.matmul(a, b, out_dtype=jnp.float32, interpret=interpret, swap=swap)
    assert y.shape == (m, 80) and _rel(y, want) < 1e-6
  # an explicit tile describes the unswapped product unless swap=True asks for the swapped one
  y = pallas_triton.matmul(a, b, tile=(64, 32, 64), out_dtype=jnp.float32, interpret=interpret, swap=True)
  assert y.shape == (m, 80) and _rel(y, want) < 1e-6


def test_swapped_config_tiles_b_rows_by_64():
  assert pallas_triton.swapped_config(1, 8192) == ((64, 16, 128), 4, 4)
  assert pallas_triton.swapped_config(32, 96) == ((64, 32, 32), 4, 4)


# slow tier; default representative: [2] (the partials summed after the kernel)
@pytest.mark.parametrize("split_k", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_pallas_gemm_split_k_matches(split_k, interpret):
  """K sliced over a third grid axis, the fp32 partials summed after the kernel; ragged M."""
  a, b = _operands(fp4jax.NVFP4, m=5, n=40, k=512)
  y = pallas_triton.matmul(
    a, b, tile=(16, 32, 64), out_dtype=jnp.float32, num_warps=4, interpret=interpret, split_k=split_k
  )
  assert y.shape == (5, 40) and _rel(y, reference.matmul(a, b, out_dtype=jnp.float32)) < 1e-6
  with pytest.raises(ValueError, match="split_k"):
    pallas_triton.matmul(a, b, tile=(16, 32, 64), interpret=True, split_k=3)


@pytest.mark.parametrize("m,n,k,want", [(16, 8192, 8192, 4), (8192, 4096, 4096, 1), (16, 128, 256, 1)])
def test_default_split_k_fills_the_gpu_only_for_skinny_gemms(m, n, k, want):
  assert pallas_triton.default_split_k(m, n, k, pallas_triton.default_config(m, k)[0]) == want


# slow tier; default representative: [256] (split-K 1 and 2 lowered); the skinny tile's kernel lowered by
# test_gemm_gemv.py::test_pallas_entry_sends_up_to_two_rows_to_the_gemv[3-256-...]
@pytest.mark.parametrize("m", [pytest.param(16, marks=pytest.mark.slow), 256])
def test_pallas_gemm_lowers_to_triton(m):
  """The even/odd nibble dots, the skinny tile and split-K lower to Triton (checked on CPU by lowering for CUDA)."""
  a, b = _operands(fp4jax.NVFP4, m=m, n=256, k=512)
  for split_k in (1, 2):
    f = jax.jit(lambda a, b, s=split_k: pallas_triton.matmul(a, b, split_k=s))
    text = f.trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    assert "fp4_dequant_matmul_nvfp4" in text and "triton" in text


def test_gemm_sass_has_tensor_core_dots_and_packed_float16_scaling():
  """The developer's SASS proxy (PyPI's Triton, where installed) on the skinny default config: NVFP4 decodes with
  packed float16 multiplies (HMUL2) and feeds HMMA; MXFP4's bf16 path has no HMUL2."""
  pytest.importorskip("triton")
  from fp4jax_kernels import triton_ir  # noqa: PLC0415

  counts = {}
  for fmt in (fp4jax.NVFP4, fp4jax.MXFP4):
    a, b = _operands(fmt, m=16, n=256, k=1024)
    (tile, nw, ns) = pallas_triton.default_config(16, 1024)
    (module,) = triton_ir.triton_modules(
      lambda a, b: pallas_triton.matmul(a, b, tile=tile, num_warps=nw, num_stages=ns, split_k=1), a, b
    )
    counts[fmt.name] = triton_ir.sass_histogram(triton_ir.compile_sm90(module, nw, ns))
  assert counts["nvfp4"]["HMMA"] > 0 and counts["nvfp4"]["HMUL2"] > 0
  assert counts["mxfp4"]["HMMA"] > 0 and counts["mxfp4"]["HMUL2"] == 0
  assert sum(counts["nvfp4"].values()) < sum(counts["mxfp4"].values())
