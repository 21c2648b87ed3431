"""Fused quantize kernel vs fp4jax's pure-JAX quantizer: atol = rtol = 0 on codes, scales, tensor scale and the
dequantized tensor, for every rounding / scale rule / block shape / direction, on ragged and non-power-of-two shapes."""

import dataclasses
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fp4jax_kernels import triton_ir
from fp4jax_kernels.quantize import api, pallas_triton, reference
from fp4jax_kernels.quantize.output import KernelOutput

import fp4jax
from fp4jax._src.quantize import split_quantize_key
from tests import oracles

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the kernel profiler is a benchmark script
import kernels_quantize_profile as profile  # noqa: E402

N, M = fp4jax.NVFP4, fp4jax.MXFP4
N46 = dataclasses.replace(N, scale_mode="four_over_six")
D, V = "with_tensor_scale", "block_scaled_only"
QUEST = dataclasses.replace(M, scale_mode="quest")


def _k(fmt, *, along="rows", dequantize=None, trust_mask=False, packed=True, **quantizer):
  """A kernel call's (quantizer, outputs): ``fp4jax.QuantizeSpec(fmt, **quantizer)`` and its ``KernelOutput``."""
  return fp4jax.QuantizeSpec(fmt, **quantizer), KernelOutput(along, dequantize, trust_mask, packed)


CASES = {  # name: ((spec, output), shape, tile)
  "nvfp4_rtn": (_k(N, dequantize=D), (48, 96), (16, 64)),
  "nvfp4_rtn_f32_ragged": (_k(N, dequantize=V, trust_mask=True), (37, 80), (16, 32)),
  "nvfp4_sr": (_k(N, rounding="sr", dequantize=D), (40, 64), (16, 64)),
  "nvfp4_rht16_te_sr": (
    _k(N, rounding="sr", hadamard=16, signs="te", dequantize=D),
    (48, 96),
    (16, 64),
  ),
  "nvfp4_rht16_random_rtn": (_k(N, hadamard=16, signs="random"), (24, 64), (16, 32)),
  "nvfp4_four_over_six_f32": (_k(N46, dequantize=V), (48, 96), (16, 64)),
  "nvfp4_ms_eden": (
    _k(N, rounding="eden", hadamard=128, signs="random", dequantize=D),
    (40, 256),
    (16, 128),
  ),
  "mxfp4_floor": (_k(M, dequantize=D), (48, 96), (16, 32)),
  "mxfp4_quest_h32": (_k(QUEST, hadamard=32, dequantize=V, trust_mask=True), (32, 64), (16, 64)),
  "mxfp4_headroom_sr": (
    _k(
      dataclasses.replace(M, scale_mode="floor_headroom"),
      rounding="sr",
      hadamard=32,
      signs="random",
      dequantize=D,
    ),
    (48, 64),
    (16, 64),
  ),
  "nvfp4_2d": (_k(N, block_shape=(16, 16), dequantize=D), (40, 96), (16, 64)),
  "nvfp4_cols_rtn": (_k(N, along="cols", dequantize=D, trust_mask=True), (40, 96), (32, 32)),
  "nvfp4_cols_rht16_sr": (
    _k(N, rounding="sr", hadamard=16, signs="te", along="cols", dequantize=D),
    (48, 96),
    (16, 32),
  ),
  "nvfp4_cols_2d": (_k(N, block_shape=(16, 16), along="cols"), (40, 96), (32, 32)),
  "nvfp4_cols_ms_eden": (
    _k(N, rounding="eden", hadamard=128, signs="random", along="cols"),
    (256, 48),
    (128, 16),
  ),
  # rows_of_transpose: fp4jax.quantize(x.T) bit for bit (dot_general's wgrad operands), read from x
  "nvfp4_xt_rht16_sr_values": (
    _k(N, rounding="sr", hadamard=16, signs="te", along="rows_of_transpose", dequantize=V),
    (48, 80),
    (32, 32),
  ),
  "nvfp4_xt_rtn_ragged_f32": (
    _k(N, along="rows_of_transpose", dequantize=D, trust_mask=True),
    (40, 37),
    (32, 32),
  ),
  "nvfp4_xt_2d_values": (
    _k(N, block_shape=(16, 16), along="rows_of_transpose", dequantize=V),
    (48, 40),
    (32, 32),
  ),
  "nvfp4_xt_ms_eden_values": (
    _k(N, rounding="eden", hadamard=128, signs="random", along="rows_of_transpose", dequantize=V),
    (256, 48),
    (128, 16),
  ),
  # packed=False: the bf16 values only (what fp4jax.operand's GEMM operands take), no codes or scales
  "nvfp4_values_only_ragged": (_k(N, dequantize=V, packed=False), (37, 80), (16, 32)),
  "nvfp4_xt_rht16_sr_values_only": (
    _k(N, rounding="sr", hadamard=16, signs="te", along="rows_of_transpose", dequantize=V, packed=False),
    (48, 80),
    (32, 32),
  ),
}


def _input(shape, dtype, seed=0):
  """N(0,1) columns spread over 4 decades, one all-zero row and values on E2M1 decision edges."""
  x = jax.random.normal(jax.random.key(seed), shape) * jnp.logspace(-2, 2, shape[1])
  x = x.at[1].set(0.0)
  return x.at[2, :8].set(jnp.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -6.0])).astype(dtype)


def _bits(a):
  return np.asarray(jax.lax.bitcast_convert_type(a, jnp.uint8))


def _assert_same(got, want):
  (qg, dg, mg, sg), (qw, dw, mw, sw) = got, want
  np.testing.assert_array_equal(np.asarray(sg), np.asarray(sw))
  assert (qg is None) == (qw is None)
  if qw is not None:
    np.testing.assert_array_equal(np.asarray(qg.codes), np.asarray(qw.codes))
    np.testing.assert_array_equal(_bits(qg.scales), _bits(qw.scales))
    np.testing.assert_array_equal(np.asarray(qg.global_scale), np.asarray(sg))
    assert (qg.shape, qg.axis, qg.block_shape, qg.hadamard) == (qw.shape, qw.axis, qw.block_shape, qw.hadamard)
  assert (dg is None, mg is None) == (dw is None, mw is None)
  if dw is not None:
    assert dg.dtype == dw.dtype and dg.shape == dw.shape
    np.testing.assert_array_equal(np.asarray(dg, np.float32), np.asarray(dw, np.float32))
  if mw is not None:
    assert mg.dtype == mw.dtype == jnp.uint8 and mg.shape == mw.shape
    np.testing.assert_array_equal(np.asarray(mg), np.asarray(mw))


# The default tier's kernel cases (interpret mode compiles each kernel on the CPU, 5 to 20 s a case); `pytest -m slow`
# and the GPU suite (benchmarks/gpu_suite.sh kernels, compiled) run every case. Across this module the default tier
# compiles one case of each kernel path: RTN along the rows and MS-EDEN's staged 128-point rotation (these two), QuEST's
# MXFP4 and its trust mask (the explicit-signs test), ragged edges with whole-unit loads (the whole-unit test), an MXFP4
# NaN block; SR with RHT16 transposed in the pair kernel and 16x16 tiles in test_dot_pallas.py's nvidia_nvfp4 dot,
# four-over-six in test_quantize_four_over_six_metrics.py.
DEFAULT_CASES = ("nvfp4_rtn", "nvfp4_ms_eden")


def _tiered(cases, default=DEFAULT_CASES):
  """``cases`` (names, or tuples whose first item is the name) with those outside ``default`` (names, or whole
  tuples) marked slow."""
  name = lambda c: c[0] if isinstance(c, tuple) else c  # noqa: E731
  return [
    c
    if name(c) in default or c in default
    else pytest.param(*(c if isinstance(c, tuple) else (c,)), marks=pytest.mark.slow)
    for c in cases
  ]


# slow tier; default representative: [nvfp4_rtn], [nvfp4_ms_eden] and the cases of the tests named at DEFAULT_CASES
@pytest.mark.parametrize("name", _tiered(sorted(CASES)))
def test_kernel_matches_reference_bit_for_bit(name, interpret):
  (spec, output), shape, tile = CASES[name]
  dtype = jnp.float32 if "f32" in name else jnp.bfloat16
  x, key = _input(shape, dtype), jax.random.key(7)
  got = pallas_triton.quantize(x, spec, key, output=output, tile=tile, interpret=interpret)
  _assert_same(got, reference.quantize(x, spec, key, output=output))


def _tiny_products_input(shape, dtype):
  """A 1e30 every 16 rows and columns (each block's amax, either direction) among negatives of 2^-60 .. 2^-19: the
  scaled values (about 2^-97 times them) underflow to -0, are subnormal or normal; and a -0.0."""
  rng = np.random.RandomState(1)
  x = -np.exp2(rng.uniform(-60, -20, shape)) * rng.uniform(1, 2, shape)
  x[:, ::16], x[::16, :], x[3, 5] = 1e30, 1e30, -0.0
  return jnp.asarray(x, jnp.float32).astype(dtype)


@pytest.mark.parametrize(
  "name",
  # slow tier; default representative: [nvfp4_rtn] (its kernel compiled once for this test and the one above)
  _tiered(["nvfp4_rtn", "nvfp4_sr", "nvfp4_four_over_six_f32", "nvfp4_cols_rtn", "mxfp4_floor"]),
)
def test_zero_code_signs_match_reference_bit_for_bit(name, interpret):
  """Negative elements whose scaled value is subnormal get code 0x8, those that underflow to -0 code 0x0
  (``tests/test_e2m1_zero_sign.py``'s rule): the kernel's IEEE product (PTX ``mul.rn.f32`` on the GPU) agrees with
  the reference bit for bit, and every zero code's sign bit with the exact float64 rule
  (``oracles.negative_exactly``) at the element's scale."""
  (spec, output), shape, tile = CASES[name]
  x, key = _tiny_products_input(shape, jnp.float32 if "f32" in name else jnp.bfloat16), jax.random.key(7)
  want = reference.quantize(x, spec, key, output=output)
  got = pallas_triton.quantize(x, spec, key, output=output, tile=tile, interpret=interpret)
  _assert_same(got, want)
  # the sign bit of every zero code from the exact float64 rule (not from the reference, which runs the same product)
  q = got[0]
  codes = np.asarray(q.unpacked_codes())
  xq = np.asarray(x, np.float32).T if output.along == "cols" else np.asarray(x, np.float32)
  zero = (codes & 7) == 0
  sign = oracles.negative_exactly(xq, _element_scales(q))
  assert np.sum(zero & sign) > 50 and np.sum(zero & ~sign & (xq < 0)) > 50  # subnormal and underflowing products
  np.testing.assert_array_equal(codes[zero] == 8, sign[zero])


def _element_scales(q) -> np.ndarray:
  """The factor that scales each element of ``q``'s (rows-major) operand before rounding, from its block scales:
  NVFP4's ``enc_b = min(1 / f32(dec_b · s_dec), FLT_MAX)`` (TE), MXFP4's ``2^-e_b`` (exact)."""
  block, n = q.block_shape[-1], q.shape[-1]
  dec = np.asarray(q.scales.astype(jnp.float32), np.float32)
  if q.scales.dtype == jnp.float8_e4m3fn:
    return oracles.nvfp4_enc(dec, np.float32(q.global_scale), q.shape)
  return np.repeat(1.0 / dec.astype(np.float64), block, axis=-1)[..., :n].astype(np.float32)


ROUTE_CASES = [
  (name, route)
  for name in sorted(CASES)
  for route in pallas_triton.ROUTES  # the distinct ones
  if CASES[name][0][1].transposed or (route != "xla" and CASES[name][0][0].hadamard and "nvfp4" in name)
]


# slow tier; default representative: the staged route by test_kernel_matches_reference_bit_for_bit[nvfp4_ms_eden]
# slow tier; default representative: test_dot_pallas.py::test_pallas_backend_matches_xla_bit_for_bit[nvidia_nvfp4]
# (SR with RHT16 along the transposed tensor, in the pair kernel, bit for bit the XLA dot)
@pytest.mark.parametrize("name, route", _tiered(ROUTE_CASES, ()))
def test_routes_give_the_same_bits(name, route, interpret):
  """Every route of the transposed and rotated specs (XLA's transpose; the kernel's input staged by the amax
  pre-pass, transposed and rotated; the tile transposed and rotated in the kernel): bit-identical to the
  reference."""
  (spec, output), shape, tile = CASES[name]
  x, key = _input(shape, jnp.bfloat16), jax.random.key(7)
  got = pallas_triton.quantize(x, spec, key, output=output, tile=tile, interpret=interpret, route=route)
  _assert_same(got, reference.quantize(x, spec, key, output=output))


PAIR_CASES = {  # name: ((rows spec, output), (cols spec, output), shape, tile, explicit signs for rows / cols)
  # nvidia_nvfp4's dY: SR for the data gradient, RHT16 + SR transposed for the weight gradient (bf16 values)
  "nvidia_dy": (
    _k(N, rounding="sr", dequantize=V, packed=False),
    _k(N, rounding="sr", hadamard=16, signs="te", along="rows_of_transpose", dequantize=V, packed=False),
    (48, 96),
    (16, 32),
    (False, False),
  ),
  # its X, every output written; the columns' bits indexed as x's (along="cols")
  "nvidia_x_packed": (
    _k(N, dequantize=D, trust_mask=True),
    _k(N, hadamard=16, signs="te", along="cols", dequantize=D),
    (64, 64),
    (32, 32),
    (False, False),
  ),
  # nvfp4_rtn's operands, f32, the transposed axis ragged (40 rows: a partial block)
  "rtn_ragged_f32": (
    _k(N, dequantize=V),
    _k(N, along="rows_of_transpose", dequantize=V),
    (40, 48),
    (16, 32),
    (False, False),
  ),
  # Quartet's dY: MXFP4 (no pre-pass), RHT32 + SR both ways, one sign vector drawn and one given
  "quartet_dy": (
    _k(M, rounding="sr", hadamard=32, signs="random", dequantize=V),
    _k(M, rounding="sr", hadamard=32, signs="random", along="rows_of_transpose", dequantize=V),
    (64, 96),
    (32, 32),
    (False, True),
  ),
  # mixed formats and rotations: NVFP4 RHT16 + SR along the rows, MXFP4 QuEST transposed (trust mask)
  "mixed_quest": (
    _k(N, rounding="sr", hadamard=16, signs="random", dequantize=D),
    _k(QUEST, hadamard=32, along="rows_of_transpose", dequantize=V, trust_mask=True),
    (64, 64),
    (32, 64),
    (True, False),
  ),
}


@pytest.mark.parametrize("name", sorted(PAIR_CASES))
# slow tier; default representative: test_dot_pallas.py::test_pallas_backend_matches_xla_bit_for_bit[nvidia_nvfp4]
# (nvidia_nvfp4's X and dY through the pair kernel in its dot, bit for bit as the XLA quantizers)
@pytest.mark.slow
def test_pair_matches_two_quantizes_bit_for_bit(name, interpret):
  """``quantize_pair``: both directions from one pre-pass and one kernel, each bit-identical to the reference
  (and so to ``quantize`` of that direction alone), with its own key and signs."""
  (rows, rows_output), (cols, cols_output), shape, tile, given = PAIR_CASES[name]
  dtype = jnp.float32 if "f32" in name else jnp.bfloat16
  x = _input(shape, dtype)
  keys = jax.random.key(7), jax.random.key(8)
  signs = [
    fp4jax.hadamard.random_signs(jax.random.key(9 + i), s.hadamard) if g else None
    for i, (s, g) in enumerate(zip((rows, cols), given))
  ]
  outputs = dict(rows_output=rows_output, cols_output=cols_output)
  got = pallas_triton.quantize_pair(
    x, rows, cols, *keys, **outputs, rows_signs=signs[0], cols_signs=signs[1], tile=tile, interpret=interpret
  )
  want = reference.quantize_pair(x, rows, cols, *keys, **outputs, rows_signs=signs[0], cols_signs=signs[1])
  _assert_same(got[0], want[0])
  _assert_same(got[1], want[1])
  assert got[1].dequantized.shape == shape[::-1]


def _own_draws(spec, key, signs) -> tuple:
  """One direction's signs and seeds as the XLA reference derives them: ``split(key, 3)`` into signs / element-bits /
  scale-bits keys (where anything is random), ``jax.random.bits(k, (2,), uint32)`` seeds, zeros where unused."""
  mode = "none" if signs is not None else spec.signs
  k_signs, k_elems, k_scales = split_quantize_key(key, spec.rounding, spec.hadamard, mode)
  draw = lambda k: jax.random.bits(k, (2,), jnp.uint32)  # noqa: E731
  zero = jnp.zeros((2,), jnp.uint32)
  return (
    spec.sign_vector(k_signs) if signs is None else signs,
    draw(k_elems) if spec.rounding == "sr" else zero,
    draw(k_scales) if spec.rounding == "eden" else zero,
  )


@pytest.mark.parametrize("name", sorted(PAIR_CASES))
def test_pair_draws_are_each_directions_own_draws(name):
  """``_draws`` of a pair (both directions' key splits and seed draws batched under ``jax.vmap``): each direction's
  signs and seeds are those the reference draws for it alone, given signs or drawn, keyed or (RTN) not."""
  (rows, rows_output), (cols, cols_output), _, _, given = PAIR_CASES[name]
  signs = [
    fp4jax.hadamard.random_signs(jax.random.key(9 + i), s.hadamard) if g else None
    for i, (s, g) in enumerate(zip((rows, cols), given))
  ]
  directions = [
    ("rows", rows, rows_output, jax.random.key(7), signs[0]),
    ("cols", cols, cols_output, jax.random.key(8), signs[1]),
  ]
  draws = jax.jit(lambda: pallas_triton._draws(directions))()
  for direction, spec, _, key, given_signs in directions:
    for got, want in zip(draws[direction], _own_draws(spec, key, given_signs)):
      assert (got is None) == (want is None)
      if want is not None:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_pair_draws_its_keys_with_one_threefry_per_stage():
  """nvidia_nvfp4's dY pair (SR both ways): one batched key split and one batched seed draw (each one threefry call
  when lowered) where one direction at a time made two of each; a direction that needs a key and has none is
  refused by name."""
  (rows, rows_output), (cols, cols_output), shape, _, _ = PAIR_CASES["nvidia_dy"]
  pair = lambda x, k1, k2: pallas_triton.quantize_pair(  # noqa: E731
    x, rows, cols, k1, k2, rows_output=rows_output, cols_output=cols_output, interpret=True
  )
  jaxpr = jax.make_jaxpr(pair)(jnp.ones(shape, jnp.bfloat16), jax.random.key(1), jax.random.key(2))
  assert str(jaxpr).count("random_split[") == 1 and str(jaxpr).count("random_bits[") == 1
  with pytest.raises(ValueError, match="key is required for rounding='sr'"):
    pair(jnp.ones(shape, jnp.bfloat16), jax.random.key(1), None)


def _pair(rows, cols) -> tuple:
  """``(rows spec, cols spec, rows output, cols output)``, ``pair_refusal``'s and ``pair_pays``' arguments."""
  return rows[0], cols[0], rows[1], cols[1]


def _outputs(rows, cols) -> dict:
  """``quantize_pair``'s output keyword arguments for two ``(spec, output)`` pairs."""
  return dict(rows_output=rows[1], cols_output=cols[1])


@pytest.mark.parametrize(
  "rows, cols, match",
  [
    (_k(N, along="cols"), _k(N, along="cols"), "rows must quantize along the rows"),
    (_k(N), _k(N), "rows must quantize along the rows and cols along axis 0"),
    (_k(N, block_shape=(16, 16)), _k(N, along="cols"), "rows has 16x16 tiles"),
    (
      _k(N),
      _k(N, rounding="eden", hadamard=128, signs="random", along="cols"),
      "cols has a 128-point Hadamard",
    ),
  ],
)
def test_pair_refuses_what_it_cannot_fuse(rows, cols, match):
  with pytest.raises(ValueError, match=f"quantize_pair: {match}"):
    pallas_triton.quantize_pair(
      jnp.ones((128, 128)), rows[0], cols[0], jax.random.key(0), **_outputs(rows, cols), interpret=True
    )


# slow tier; default representative: test_pair_refuses_what_it_cannot_fuse and test_dot_pallas.py's
# test_auto_is_xla_off_gpu_and_pallas_where_a_gpu_takes_the_operand ("auto"'s pair only where it pays, not in a batch)
@pytest.mark.slow
def test_pair_api_picks_the_reference_off_gpu_and_refused_pairs():
  """``api.quantize_pair``'s ``"auto"``: the kernel only on a GPU that runs it and for a pair it speeds up."""
  rows, cols = _k(N, dequantize=V), _k(N, along="rows_of_transpose", dequantize=V)
  x = _input((32, 64), jnp.bfloat16)
  got = jax.make_jaxpr(lambda x: api.quantize_pair(x, rows[0], cols[0], **_outputs(rows, cols)))(x)
  assert ("pallas_call" in str(got)) == (jax.default_backend() == "gpu")
  eden = _k(N, rounding="eden", hadamard=128, signs="random", along="rows_of_transpose")
  x = _input((128, 64), jnp.bfloat16)
  pair = lambda x: api.quantize_pair(
    x, rows[0], eden[0], None, jax.random.key(0), **_outputs(rows, eden), backend="auto"
  )
  assert "fp4_quantize_pair" not in str(jax.make_jaxpr(pair)(x))
  quartet = _k(M, rounding="sr", hadamard=32, signs="random", dequantize=V)
  quartet_t = _k(M, rounding="sr", hadamard=32, signs="random", dequantize=V, along="rows_of_transpose")
  assert pallas_triton.pair_refusal(*_pair(quartet, quartet_t)) is None
  assert not pallas_triton.pair_pays(*_pair(quartet, quartet_t))
  rht16 = _k(N, rounding="sr", hadamard=16, signs="te", along="rows_of_transpose")
  assert pallas_triton.pair_pays(*_pair(rows, cols)) and pallas_triton.pair_pays(*_pair(_k(N), rht16))


@pytest.mark.parametrize(
  "hadamard, dtype, along",
  [
    pytest.param(h, d, a, marks=pytest.mark.slow)
    for h in (16, 128)
    for d in (jnp.bfloat16, jnp.float32)
    for a in ("rows", "rows_of_transpose")
  ],
  # slow tier; default representative: MS-EDEN's 128-point staging by
  # test_kernel_matches_reference_bit_for_bit[nvfp4_ms_eden] (its default route), and RHT16 transposed in the
  # nvidia_nvfp4 dot of test_dot_pallas.py::test_pallas_backend_matches_xla_bit_for_bit[nvidia_nvfp4]
  ids=lambda v: jnp.dtype(v).name if not isinstance(v, (int, str)) else str(v),
)
def test_prepass_stages_the_rotated_input_and_the_amax(along, dtype, hadamard, interpret):
  """``stage_and_amax`` on a ragged shape: the tensor rotated as ``fp4jax.hadamard.rotated`` does (rounded to
  ``x.dtype``), transposed for the transposed direction, and the rotated amax of the XLA pre-pass. RHT16 (loaded
  in parts) and MS-EDEN's 128 points (the tile load), with tiles ragged along both axes."""
  if hadamard == 16:
    spec = _k(N, rounding="sr", hadamard=16, signs="te", along=along)
    signs, shape = fp4jax.hadamard.TE_SIGNS_16, (48, 208)
  else:
    spec = _k(N, rounding="eden", hadamard=128, signs="random", along=along)
    signs, shape = fp4jax.hadamard.random_signs(jax.random.key(3), 128), (80, 384)
  x = _input(shape if along == "rows" else shape[::-1], dtype)
  staged, amax = pallas_triton.stage_and_amax(x, *spec, signs, interpret=interpret)
  x_rows = x.T if spec[1].transposed else x
  want = fp4jax.hadamard.rotated(x_rows, hadamard, axis=-1, signs=signs)
  assert staged.dtype == dtype
  np.testing.assert_array_equal(np.asarray(staged, np.float32), np.asarray(want, np.float32))
  want_amax = pallas_triton.tensor_amax(x_rows, spec[0], KernelOutput(), signs, use_kernel=False)
  np.testing.assert_array_equal(np.asarray(amax), np.asarray(want_amax))


@pytest.mark.parametrize(("along", "tile", "num_warps"), [("rows", (32, 128), 8), ("rows_of_transpose", (128, 16), 2)])
def test_prepass_tile_and_warps_change_the_launch_not_the_values(along, tile, num_warps, interpret, jaxpr_equations):
  """A tuned pre-pass launch (``stage_and_amax(tile=, num_warps=)``, the sweep's knobs) stages the oracle's rotated
  tensor and amax too, on a shape ragged along both axes; a tile that splits a Hadamard chunk, or is not made of
  powers of two, is refused naming it."""
  spec = _k(N, rounding="eden", hadamard=128, signs="random", along=along)
  signs = fp4jax.hadamard.random_signs(jax.random.key(4), 128)
  x = _input((80, 384) if along == "rows" else (384, 80), jnp.bfloat16)
  staged, amax = pallas_triton.stage_and_amax(x, *spec, signs, tile=tile, num_warps=num_warps, interpret=interpret)
  x_rows = x.T if spec[1].transposed else x
  want = fp4jax.hadamard.rotated(x_rows, 128, axis=-1, signs=signs)
  np.testing.assert_array_equal(np.asarray(staged, np.float32), np.asarray(want, np.float32))
  np.testing.assert_array_equal(np.asarray(amax), np.max(np.abs(np.asarray(want, np.float32))))
  f = lambda x: pallas_triton.stage_and_amax(x, *spec, signs, tile=tile, num_warps=num_warps, interpret=True)
  (call,) = [e for e in jaxpr_equations(jax.make_jaxpr(f)(x).jaxpr) if e.primitive.name == "pallas_call"]
  assert call.params["grid_mapping"].grid == (-(-x.shape[0] // tile[0]), -(-x.shape[1] // tile[1]))
  assert call.params["compiler_params"].num_warps == num_warps
  bad = (tile[0], 64) if along == "rows" else (64, tile[1])
  with pytest.raises(ValueError, match=rf"tile \({bad[0]}, {bad[1]}\) must be two powers of two holding whole 128"):
    pallas_triton.stage_and_amax(x, *spec, signs, tile=bad, interpret=True)
  with pytest.raises(ValueError, match=r"tile \(24, 128\) must be two powers of two"):
    pallas_triton.stage_and_amax(x, *spec, signs, tile=(24, 128), interpret=True)


def test_prepass_stages_the_transpose(interpret):
  spec = _k(N, along="rows_of_transpose")
  x = _input((48, 200), jnp.bfloat16)
  xt, amax = pallas_triton.stage_and_amax(x, *spec, None, interpret=interpret)
  np.testing.assert_array_equal(np.asarray(xt, np.float32), np.asarray(x.T, np.float32))
  np.testing.assert_array_equal(np.asarray(amax), np.max(np.abs(np.asarray(x, np.float32))))


def test_routes_are_named_and_fall_back_where_nothing_is_staged():
  spec = _k(N, rounding="sr", hadamard=16, signs="te")
  with pytest.raises(ValueError, match="route must be one of"):
    pallas_triton.quantize(jnp.ones((16, 64)), spec[0], jax.random.key(0), route="registers", interpret=True)
  assert pallas_triton.effective_route(*spec, "prepass", has_prepass=True) == "prepass"
  assert pallas_triton.effective_route(*spec, "prepass", has_prepass=False) == "kernel"  # amax given, or MXFP4
  assert pallas_triton.effective_route(*_k(N), "prepass", has_prepass=True) == "xla"  # nothing to stage
  with pytest.raises(ValueError, match="nothing to stage"):
    pallas_triton.stage_and_amax(jnp.ones((16, 64)), *_k(N), None, interpret=True)


@pytest.mark.parametrize(
  "fmt",
  # slow tier; default representative: [mxfp4] (the kernel on a NaN block, bit for bit as the reference), the NaN
  # tensor amax's rule by test_minmax_substitutes_propagate_nan (the kernels' max) and tests/test_quantize.py (the core)
  [M, pytest.param(N, marks=pytest.mark.slow)],
  ids=lambda f: f.name,
)
def test_nan_block_keeps_nan_scale(fmt, interpret):
  """MXFP4: the block holding NaN gets the NaN scale. NVFP4: the tensor amax is NaN, so every scale is NaN. Codes
  agree with the reference too (Triton's NaN-dropping max/min would clip NaN to ±6)."""
  spec, output = _k(fmt, dequantize=D)
  x = _input((16, 64), jnp.float32).at[3, 40].set(jnp.nan)
  q, deq, _, _ = got = pallas_triton.quantize(x, spec, output=output, tile=(16, 64), interpret=interpret)
  _assert_same(got, reference.quantize(x, spec, output=output))
  if fmt is M:
    assert _bits(q.scales)[3, 1] == 0xFF and np.isnan(np.asarray(deq[3, 32:])).all()
  else:
    assert (_bits(q.scales) == 0x7F).all() and np.isnan(np.asarray(q.global_scale)) and np.isnan(deq).all()


def test_api_auto_uses_reference_on_cpu_and_accepts_names():
  (spec, output), shape, _ = CASES["nvfp4_rtn"]
  x = _input(shape, jnp.bfloat16)
  _assert_same(api.quantize(x, spec, output=output, backend="xla"), reference.quantize(x, spec, output=output))
  with pytest.raises(ValueError, match="backend"):
    api.quantize(x, spec, output=output, backend="cuda")


@pytest.mark.parametrize(
  "bad, match",
  [
    (dict(x=jnp.ones((4, 4, 16))), "2D"),
    (dict(x=jnp.ones((16, 40))), "multiple of the block"),
    (dict(tile=(16, 48)), "powers of two"),
    (dict(tile=(16, 8)), "whole blocks"),
  ],
)
def test_bad_input_is_named(bad, match):
  args = dict(x=jnp.ones((16, 64)), spec=fp4jax.QuantizeSpec(N), tile=(16, 64))
  args.update(bad)
  with pytest.raises(ValueError, match=match):
    pallas_triton.quantize(args["x"], args["spec"], tile=args["tile"], interpret=True)


@pytest.mark.parametrize(
  "name",
  [
    "nvfp4_rtn",
    "nvfp4_ms_eden",
    # slow tier; default representative: [nvfp4_xt_rht16_sr_values] and [nvfp4_ms_eden] (the columns' kernels are
    # the transposed directions' with another output layout)
    pytest.param("nvfp4_cols_rht16_sr", marks=pytest.mark.slow),
    "nvfp4_four_over_six_f32",
    # slow tier; default representative: test_quest_std_uses_the_ieee_square_root_in_triton (this kernel in Triton IR)
    pytest.param("mxfp4_quest_h32", marks=pytest.mark.slow),
    pytest.param("nvfp4_cols_ms_eden", marks=pytest.mark.slow),
    "nvfp4_xt_rht16_sr_values",
  ],
)
def test_kernel_lowers_to_triton(name):
  """Every primitive of the kernel has a Pallas Triton lowering (checked on CPU by lowering for CUDA); the
  transposed directions on every route."""
  (spec, output), _, _ = CASES[name]
  x = jnp.ones((256, 256), jnp.bfloat16)
  for route in pallas_triton.ROUTES:
    quantize = lambda x, k: pallas_triton.quantize(x, spec, k, output=output, route=route)
    text = jax.jit(quantize).trace(x, jax.random.key(0)).lower(lowering_platforms=("cuda",)).as_text()
    assert "triton" in text
    staged = pallas_triton.effective_route(spec, output, route, spec.fmt.name == "nvfp4") == "prepass"
    assert ("fp4_staging_amax" in text) == staged, route


def _assert_masked(module: str, stores: int):
  """Every tensor load and store of ``module`` is masked, but one-element blocks (a grid of partial results is
  never ragged) and 1D loads and stores (slices of the Hadamard sign vector, the NVFP4 tensor scales: whole-array
  blocks)."""
  accesses = [
    l.split(":")[0]
    for l in module.splitlines()
    if ("tt.store" in l or ("tt.load" in l and "tensor<" in l))
    and "tensor<1x1x" not in l
    and not re.search(r"tt\.(load|store) .*: tensor<\d+x!tt\.ptr", l)
  ]
  assert sum("tt.store" in a for a in accesses) == stores
  for access in accesses:  # tt.load %ptr, %mask, %other / tt.store %ptr, %value, %mask
    assert access.count("%") >= 4 if "tt.load" in access else access.count("%") == 3, access


@pytest.mark.parametrize("name", ["nvfp4_rtn_f32_ragged", "nvfp4_cols_rtn", "nvfp4_2d", "nvfp4_xt_rtn_ragged_f32"])
def test_ragged_edge_blocks_are_masked_in_triton(name):
  """Pallas Triton does not clip edge blocks (interpret mode does): on ragged shapes every load and store must carry
  a mask, or the kernel writes over the next row / the next buffer on the GPU."""
  (spec, output), shape, tile = CASES[name]
  quantize = lambda x: pallas_triton.quantize(x, spec, output=output, tile=tile)
  (module,) = triton_ir.triton_modules(quantize, jnp.ones(shape, jnp.float32))
  _assert_masked(module, stores=2 + bool(output.dequantize) + output.trust_mask)


@pytest.mark.parametrize(
  "name", ["nvfp4_xt_rtn_ragged_f32", "nvfp4_xt_rht16_sr_values", "nvfp4_rht16_te_sr", "nvfp4_ms_eden"]
)
def test_ragged_staging_prepass_is_masked_in_triton(name):
  """The pre-pass that writes ``xᵀ`` or the rotated ``x`` (rotated: loaded in parts, ``load_rotated``, up to 32
  points; MS-EDEN's 128 along the rows in 16 vector parts, ``rotate_vector_parts``, each stored on its own) on a
  ragged shape: its tiles stick out of ``x`` (and of what it writes)."""
  (spec, output), shape, tile = CASES[name]
  quantize = lambda x: pallas_triton.quantize(x, spec, jax.random.key(0), output=output, tile=tile, route="prepass")
  prepass, main = triton_ir.triton_modules(quantize, jnp.ones(shape, jnp.float32))
  assert "fp4_staging_amax" in prepass
  vectors = pallas_triton.rotates_in_vector_parts(spec, output)
  assert vectors == (name == "nvfp4_ms_eden")
  # the staged xᵀ or rotated x, whole or by part (the partial max is a (1, 1) block)
  _assert_masked(prepass, stores=spec.hadamard // pallas_triton.VECTOR_PART if vectors else 1)


def test_quest_std_uses_the_ieee_square_root_in_triton():
  """Triton's math.sqrt is approximate; QuEST's block std must use sqrt.rn like XLA (kernel_safe's rule)."""
  (spec, output), shape, tile = CASES["mxfp4_quest_h32"]
  quantize = lambda x: pallas_triton.quantize(x, spec, output=output, tile=tile)
  (module,) = triton_ir.triton_modules(quantize, jnp.ones(shape, jnp.float32))
  assert "sqrt.rn.f32" in module and "math.sqrt" not in module


def test_correctly_rounded_division_is_one_ieee_instruction_in_triton():
  """``fp4jax.ieee.div_rn`` (a long division around a first guess, for XLA) becomes one PTX ``div.rn.f32`` inside a
  kernel, the IEEE quotient it emulates: the RTN kernel's division per block (``1 / (dec_b · s_dec)``) and its two
  tensor scales (``s_enc = 2688 / amax``, ``s_dec = 1 / s_enc``), which it computes from the amax, so that the
  program around the kernel runs none of the long division's integer arithmetic."""
  spec = fp4jax.QuantizeSpec(fp4jax.NVFP4)
  fn, x = lambda x: pallas_triton.quantize(x, spec, amax=jnp.float32(1.0)), jnp.ones((64, 256), jnp.bfloat16)
  (module,) = triton_ir.triton_modules(fn, x)
  assert module.count("div.rn.f32") == 3 and "arith.divf" not in module
  glue = jax.jit(fn).trace(x).lower(lowering_platforms=("cuda",)).as_text()
  assert "div_rn" not in glue and "stablehlo.divide" not in glue


# slow tier; default representative: test_dot_pallas.py::test_pallas_backend_matches_xla_bit_for_bit[nvidia_nvfp4] (its
# kernels write the bf16 values only, bit for bit as the XLA path) and test_ragged_edge_blocks_are_masked_in_triton
@pytest.mark.slow
def test_values_only_writes_the_packed_kernels_values_and_nothing_else(interpret):
  """``packed=False``: the same bf16 values and decode scale as the packed kernel, no QTensor, one kernel output."""
  (spec, output), shape, tile = CASES["nvfp4_values_only_ragged"]
  x, key = _input(shape, jnp.bfloat16), jax.random.key(7)
  got = pallas_triton.quantize(x, spec, key, output=output, tile=tile, interpret=interpret)
  packed = dataclasses.replace(output, packed=True)
  full = pallas_triton.quantize(x, spec, key, output=packed, tile=tile, interpret=interpret)
  assert got.qtensor is None and full.qtensor is not None
  np.testing.assert_array_equal(np.asarray(got.dequantized, np.float32), np.asarray(full.dequantized, np.float32))
  np.testing.assert_array_equal(np.asarray(got.global_scale), np.asarray(full.qtensor.global_scale))
  (module,) = triton_ir.triton_modules(lambda x: pallas_triton.quantize(x, spec, output=output, tile=tile), x)
  _assert_masked(module, stores=1)
  with pytest.raises(ValueError, match=r"KernelOutput\(packed=False\).*set dequantize"):
    KernelOutput(packed=False)


# name: ((spec, output), shape, tile, the unit each thread loads): whole units need a tile of 32·warps units
UNIT_CASES = {
  "nvfp4_rtn_ragged": (_k(N, dequantize=D, trust_mask=True), (37, 80), (16, 32), 16),
  "nvfp4_rtn_f32": (_k(N, dequantize=V), (48, 96), (16, 32), 16),  # 4 loads of 4 floats per block
  "nvfp4_sr": (_k(N, rounding="sr", dequantize=D), (40, 64), (16, 32), 16),
  "nvfp4_rht16_te_sr": (
    _k(N, rounding="sr", hadamard=16, signs="te", dequantize=D),
    (48, 96),
    (16, 32),
    16,
  ),
  "nvfp4_four_over_six": (_k(N46, dequantize=V), (48, 96), (16, 32), 16),
  "mxfp4_quest_h32": (_k(QUEST, hadamard=32, dequantize=V, trust_mask=True), (32, 96), (32, 32), 32),
  "mxfp4_floor_f32": (_k(M, dequantize=D), (32, 96), (32, 32), 32),  # 8 loads of 4 floats per block
  "nvfp4_xt_rht16_sr_values_only": (
    _k(N, rounding="sr", hadamard=16, signs="te", along="rows_of_transpose", dequantize=V, packed=False),
    (48, 80),
    (32, 16),
    16,
  ),
}


@pytest.mark.parametrize(
  "name",
  # slow tier; default representative: [nvfp4_rtn_ragged] (a ragged shape, the trust mask, 16-element units)
  _tiered(sorted(UNIT_CASES), ("nvfp4_rtn_ragged",)),
)
def test_whole_unit_loads_match_reference_bit_for_bit(name, interpret):
  """One warp, so that these small tiles hold a unit per thread: the kernel loads each block (or Hadamard chunk)
  into one thread (``load_units``), in pieces of 16 bytes, and still gives the reference's bits."""
  (spec, output), shape, tile, unit = UNIT_CASES[name]
  dtype = jnp.float32 if "f32" in name else jnp.bfloat16
  n_axis = shape[0] if output.transposed else shape[1]
  assert pallas_triton.load_unit(spec, output, n_axis, "xla", tile, num_warps=1) == unit
  x, key = _input(shape, dtype), jax.random.key(7)
  got = pallas_triton.quantize(x, spec, key, output=output, tile=tile, num_warps=1, interpret=interpret)
  _assert_same(got, reference.quantize(x, spec, key, output=output))


def test_load_unit_falls_back_to_plain_tile_loads():
  """0 (a plain tile load) where a thread cannot own whole units: MS-EDEN's 128-point chunks (register spills),
  2D blocks, the in-register transpose, a ragged quantized axis, a tile with fewer units than threads."""
  rtn = _k(N)
  assert pallas_triton.load_unit(*rtn, 512, "xla", (16, 512), 4) == 16
  assert pallas_triton.load_unit(*_k(M), 512, "xla", (16, 512), 4) == 32
  assert pallas_triton.load_unit(*CASES["nvfp4_ms_eden"][0], 512, "xla", (64, 512), 4) == 0
  assert pallas_triton.load_unit(*CASES["nvfp4_ms_eden"][0], 512, "prepass", (64, 512), 4) == 16  # staged rotation
  assert pallas_triton.load_unit(*CASES["nvfp4_2d"][0], 512, "xla", (16, 512), 4) == 0
  cols = CASES["nvfp4_cols_rtn"][0]
  assert pallas_triton.load_unit(*cols, 512, "xla", (512, 16), 4) == 16
  assert pallas_triton.load_unit(*cols, 512, "kernel", (512, 16), 4) == 0
  assert pallas_triton.load_unit(*cols, 504, "xla", (512, 16), 4) == 0
  assert pallas_triton.load_unit(*rtn, 512, "xla", (16, 64), 4) == 0  # 64 units for 128 threads


def test_rotations_up_to_32_points_load_their_chunks_in_parts():
  """``load_rotated`` takes 16- and 32-point Hadamards (the pre-pass in both directions, the kernel's transposed
  tiles); MS-EDEN's 128 keeps the tile load, but for the pre-pass along the rows, which loads it in vector parts
  (``rotate_vector_parts``) on (16, 256) tiles. The transposing pre-pass takes wider tiles."""
  in_parts = lambda name: pallas_triton.rotates_in_parts(CASES[name][0][0])
  assert in_parts("nvfp4_xt_rht16_sr_values") and in_parts("nvfp4_cols_rht16_sr") and in_parts("nvfp4_rht16_te_sr")
  assert in_parts("mxfp4_headroom_sr")
  assert not in_parts("nvfp4_xt_ms_eden_values") and not in_parts("nvfp4_ms_eden")
  assert not in_parts("nvfp4_xt_rtn_ragged_f32") and not in_parts("nvfp4_rtn")
  assert pallas_triton.prepass_tile(*CASES["nvfp4_xt_rht16_sr_values"][0]) == (256, 64)
  assert pallas_triton.prepass_tile(*CASES["nvfp4_rht16_te_sr"][0]) == pallas_triton.default_tile(
    *CASES["nvfp4_rht16_te_sr"][0]
  )
  vectors = lambda name: pallas_triton.rotates_in_vector_parts(*CASES[name][0])
  assert vectors("nvfp4_ms_eden") and not vectors("nvfp4_xt_ms_eden_values") and not vectors("nvfp4_rht16_te_sr")
  assert pallas_triton.prepass_tile(*CASES["nvfp4_ms_eden"][0]) == (16, 256)


def test_default_route_follows_the_hadamard():
  """The pre-pass stages the rotated input where there is one, tiles are transposed and rotated in registers where
  there is none, XLA transposes without a Hadamard (BENCHMARKS.md §5 at 83b474b)."""
  route = lambda name, has_prepass=True: pallas_triton.effective_route(
    *CASES[name][0], pallas_triton.default_route(CASES[name][0][0]), has_prepass
  )
  assert route("nvfp4_cols_rht16_sr") == route("nvfp4_xt_ms_eden_values") == route("nvfp4_ms_eden") == "prepass"
  assert route("nvfp4_cols_rht16_sr", has_prepass=False) == route("mxfp4_headroom_sr", False) == "kernel"
  assert route("nvfp4_cols_rtn") == route("nvfp4_rtn") == "xla"


def test_default_tile_is_wider_for_rtn_along_rows():
  """(16, 512) for RTN along the rows without a Hadamard and with one block scaling, (32, 256) for 16x16 tiles,
  (16, 256) otherwise (BENCHMARKS.md §5 at 83b474b; four-over-six: the sweep in CHANGELOG, eleventh session)."""
  assert pallas_triton.default_tile(*_k(N)) == (16, 512)
  assert pallas_triton.default_tile(*_k(N46)) == (16, 256)
  assert pallas_triton.default_tile(*_k(N, block_shape=(16, 16))) == (32, 256)
  assert pallas_triton.default_tile(*_k(N, rounding="sr")) == (16, 256)
  assert pallas_triton.default_tile(*CASES["nvfp4_rht16_random_rtn"][0]) == (16, 256)
  assert pallas_triton.default_tile(*CASES["nvfp4_cols_rtn"][0]) == (256, 32)


def test_default_num_warps_follows_the_tile_sweep():
  """8 warps for MS-EDEN's 128-point rotation and four-over-six's two block scalings, 4 elsewhere (BENCHMARKS.md §5
  at 83b474b)."""
  assert pallas_triton.default_num_warps(CASES["nvfp4_ms_eden"][0][0]) == 8
  assert pallas_triton.default_num_warps(CASES["nvfp4_four_over_six_f32"][0][0]) == 8
  assert pallas_triton.default_num_warps(CASES["nvfp4_rht16_te_sr"][0][0]) == 4
  assert pallas_triton.default_num_warps(CASES["nvfp4_rtn"][0][0]) == 4


def test_ptx_counts_of_the_kernels():
  """The developer's PTX proxy (PyPI's Triton, where installed): SR costs more instructions than RTN."""
  pytest.importorskip("triton")
  rtn = profile.ptx_counts(profile.FULL["nvfp4_rtn_1x16"])
  sr = profile.ptx_counts(profile.FULL["nvfp4_sr_1x16"])
  assert 0 < rtn["ptx_per_element"] < sr["ptx_per_element"]
  assert 0 < rtn["sass_per_element"] < sr["sass_per_element"]
  assert rtn["shared_bytes"] >= 0 and rtn["convert_layout"] >= 0


def test_prepass_sweep_tries_the_default_launch_first():
  """The sweep's ratios are to its first launch of each direction: the pre-pass's default (``prepass_tile``,
  ``prepass_num_warps``, as ``stage_and_amax`` launches it): (16, 256) on 4 warps along the rows, (128, 32) on 8
  along the rows of the transpose."""
  defaults = {}
  for along, configs in profile.PREPASS_CONFIGS.items():
    spec, output = profile.bench.make_case(fp4jax.NVFP4, rounding="eden", hadamard=128, signs="random", along=along)
    defaults[along] = (pallas_triton.prepass_tile(spec, output), pallas_triton.prepass_num_warps(spec, output))
    assert configs[0] == defaults[along]
  assert defaults == {"rows": ((16, 256), 4), "rows_of_transpose": ((128, 32), 8)}


def test_prepass_sweep_rows_check_every_launch_against_the_default(monkeypatch):
  """The sweep (interpret mode off a GPU, small shapes): a row per shape, direction and launch, each compared with
  the default launch's staged bits; a launch that cannot run is a row with its error, not a crash."""
  monkeypatch.setattr(profile, "PREPASS_SHAPES", ((48, 256),))
  configs = {"rows": [((16, 256), 4), ((16, 128), 8)], "rows_of_transpose": [((256, 16), 4), ((128, 16), 2)]}
  monkeypatch.setattr(
    profile, "PREPASS_CONFIGS", configs | {"rows_of_transpose": [*configs["rows_of_transpose"], ((128, 24), 4)]}
  )
  monkeypatch.setattr(profile.bench, "copy_bandwidth", lambda x: (1.0, 1.0))
  monkeypatch.setattr(profile, "time_ms", lambda f, *a: 2.0)
  stage = pallas_triton.stage_and_amax

  def planted(x, **kw):  # a launch that stages other bits must be reported as such
    staged, amax = stage(x, **kw)
    return (staged + 1 if kw["tile"] == (128, 16) else staged), amax

  monkeypatch.setattr(profile.pallas_triton, "stage_and_amax", planted)
  rows = profile.prepass_sweep()
  assert [(r["along"], tuple(r["tile"]), r["warps"]) for r in rows] == [
    ("rows", (16, 256), 4),
    ("rows", (16, 128), 8),
    ("rows_of_transpose", (256, 16), 4),
    ("rows_of_transpose", (128, 16), 2),
    ("rows_of_transpose", (128, 24), 4),
  ]
  assert [r["same_bits"] for r in rows[:4]] == [True, True, True, False]
  assert all(r["vs_default"] == 1.0 for r in rows[:4])
  assert "must be two powers of two" in rows[4]["error"] and "ms" not in rows[4]


def test_pair_sass_counts_of_a_steps_pairs():
  """The pair kernels as "auto" takes them on a GPU (PyPI's Triton, where installed): a pre-pass and a quantize
  kernel per pair, nvidia_nvfp4's dY pair (SR both ways, RHT16 on one) costlier per element than its X pair (RTN),
  and issue_us the per-element count at the H200's issue rate."""
  pytest.importorskip("triton")
  shape = (4096, 2048)  # 2^23 elements: the smallest that "auto" sends to the kernels
  x_pair = profile.pair_sass_counts(*profile.PAIRS["nvidia_nvfp4_x_pair"], shape=shape)
  dy_pair = profile.pair_sass_counts(*profile.PAIRS["nvidia_nvfp4_dy_pair"], shape=shape)
  assert set(x_pair) == set(dy_pair) == {"fp4_pair_amax", "fp4_quantize_pair"}
  assert 0 < x_pair["fp4_quantize_pair"]["sass_per_element"] < dy_pair["fp4_quantize_pair"]["sass_per_element"]
  for counts in (*x_pair.values(), *dy_pair.values()):
    want = counts["sass_per_element"] * shape[0] * shape[1] / 32 / profile.H200_ISSUE_RATE * 1e6
    assert counts["issue_us"] == pytest.approx(want, rel=0.01)
  (staging,) = profile.prepass_sass_counts("rows", shape=shape).items()  # MS-EDEN's 128 points cross threads
  assert staging[0] == "fp4_staging_amax" and staging[1]["barriers_per_thread"] > 0 < staging[1]["sass_per_element"]


@pytest.mark.skipif(
  jax.default_backend() != "gpu", reason="randomized larger shapes: GPU only (interpret mode is slow)"
)
@pytest.mark.parametrize("seed", range(3))
def test_randomized_shapes_on_gpu(seed):
  rng = np.random.default_rng(seed)
  m, k = int(rng.integers(1, 700)), 128 * int(rng.integers(1, 24))
  for name in ("nvfp4_rtn", "nvfp4_rht16_te_sr", "nvfp4_ms_eden", "nvfp4_cols_rht16_sr"):
    spec, output = CASES[name][0]
    if output.along == "cols":
      m = 16 * max(1, m // 16)
    x, key = _input((max(m, 3), k), jnp.bfloat16, seed), jax.random.key(seed)
    _assert_same(pallas_triton.quantize(x, spec, key, output=output), reference.quantize(x, spec, key, output=output))


@pytest.mark.parametrize("along, nonfinite", [("rows", None), ("cols", None), ("rows", jnp.inf), ("rows", jnp.nan)])
# slow tier; default representative: test_dot_pallas.py::test_pallas_backend_matches_xla_bit_for_bit[nvidia_nvfp4] (the
# pair kernel's rotated amax sets the tensor scale of the bits compared) and test_minmax_substitutes_propagate_nan
# (the kernels' max keeps NaN: a NaN tensor scale)
@pytest.mark.slow
def test_rotated_amax_prepass_matches_xla(along, nonfinite, interpret):
  spec = _k(N, rounding="sr", hadamard=16, signs="te", along=along)
  x = _input((40, 512) if along == "rows" else (48, 512), jnp.bfloat16)  # rows: a ragged last tile of chunks
  if nonfinite is not None:
    x = x.at[5, 7].set(nonfinite)
  signs = fp4jax.hadamard.TE_SIGNS_16
  got = pallas_triton.tensor_amax(x, *spec, signs, interpret=interpret)
  want = pallas_triton.tensor_amax(x, *spec, signs, use_kernel=False)
  if nonfinite is None:
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  else:  # non-finite amax -> NaN tensor scale (fp4jax.quantize's documented rule). XLA's CPU max can drop NaN, so
    assert not np.isfinite(np.asarray(got))  # the XLA pre-pass is not compared here (reported to the foundation).


def test_minmax_substitutes_propagate_nan():
  """Triton's maxnumf/minnumf drop NaN; kernel_safe restores XLA's rule (checked here on the substituted jaxpr)."""
  from fp4jax_kernels import triton_compat

  x = jnp.array([[1.0, jnp.nan, -2.0], [3.0, 0.5, -jnp.inf]], jnp.float32)
  fn = lambda x: (jnp.clip(x, -1.5, 1.5), jnp.max(x, axis=1), jnp.min(x, axis=1), jnp.maximum(x, 0))
  got = triton_compat.kernel_safe(fn, interpret=True)(x)
  for g, w in zip(got, fn(x)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
  assert np.isnan(np.asarray(got[1])[0]) and np.isnan(np.asarray(got[0])[0, 1])


def test_clz_substitute_is_exact():
  from fp4jax_kernels import triton_compat

  u = jnp.array([0, 1, 2, 3, 255, 256, 0x7FFFFF, 0x800000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF], jnp.uint32)
  np.testing.assert_array_equal(np.asarray(triton_compat._clz(u)), np.asarray(jax.lax.clz(u)))
  i = jax.lax.bitcast_convert_type(u, jnp.int32)
  np.testing.assert_array_equal(np.asarray(triton_compat._clz(i)), np.asarray(jax.lax.clz(i)))


@pytest.mark.parametrize(
  "job, shape, tile",
  [
    # slow tier; default representative: [quest_mask_rtn_no_key] (explicit signs; MXFP4 QuEST and its trust mask, bit
    # for bit as the reference)
    pytest.param(
      _k(N, rounding="sr", hadamard=16, signs="random", along="rows_of_transpose", dequantize=V),
      (64, 32),
      (64, 32),
      marks=pytest.mark.slow,
    ),
    (_k(QUEST, hadamard=32, signs="random", trust_mask=True), (16, 64), (16, 64)),
  ],
  ids=["sr_rht16_rows_of_transpose", "quest_mask_rtn_no_key"],
)
def test_explicit_signs_are_the_rotation(job, shape, tile, interpret):
  """``signs=s``: H·diag(s) per chunk, i.e. the sign-free rotation of x ⊙ s (exact: ±1), with the same key split
  for the rounding bits; RTN needs no key then. A vector unlike the key's draw changes the codes."""
  spec, output = job
  x = _input(shape, jnp.bfloat16)
  key = None if spec.rounding == "rtn" else jax.random.key(7)
  s = fp4jax.hadamard.random_signs(jax.random.key(99), spec.hadamard)
  reps = shape[0 if output.transposed else 1] // spec.hadamard
  xs = x * (jnp.tile(s, reps)[:, None] if output.transposed else jnp.tile(s, reps)).astype(x.dtype)
  got = pallas_triton.quantize(x, spec, key, output=output, signs=s, tile=tile, interpret=interpret)
  _assert_same(got, reference.quantize(xs, dataclasses.replace(spec, signs="none"), key, output=output))
  np.testing.assert_array_equal(np.asarray(got.qtensor.signs), np.asarray(s))
  drawn = reference.quantize(x, spec, jax.random.key(7), output=output).qtensor  # the kernel's own draw: tested above
  assert not np.array_equal(np.asarray(drawn.codes), np.asarray(got.qtensor.codes))


def test_trust_mask_is_nontrivial_and_values_lack_the_tensor_scale():
  """The outputs the kernel matches bit for bit (above) are what they claim: QuEST's mask clips some elements and
  keeps most (so the mask comparisons are not vacuous), and the block-scaled bf16 values times the tensor scale
  are the with-tensor-scale dequantized tensor (the f32 product ``fp4jax.operand.Operand.dequantize`` takes)."""
  (spec, output), shape, _ = CASES["mxfp4_quest_h32"]
  mask = np.asarray(reference.quantize(_input(shape, jnp.bfloat16), spec, output=output).trust_mask)
  assert 0 < (mask == 0).sum() < mask.size // 4 and set(np.unique(mask)) == {0, 1}
  x = _input((48, 96), jnp.float32)
  q, values, _, _ = reference.quantize(x, fp4jax.QuantizeSpec(N), output=KernelOutput(dequantize=V))
  full = reference.quantize(x, fp4jax.QuantizeSpec(N), output=KernelOutput(dequantize=D)).dequantized
  assert values.dtype == jnp.bfloat16 and not np.array_equal(np.asarray(values, np.float32), np.asarray(full))
  np.testing.assert_array_equal(np.asarray(values, np.float32) * np.asarray(q.global_scale), np.asarray(full))


@pytest.mark.parametrize(
  "spec, signs, match",
  [
    (fp4jax.QuantizeSpec(N, hadamard=16, signs="te"), jnp.ones(16), r"spec\.signs='random'"),
    (fp4jax.QuantizeSpec(N, hadamard=16, signs="random"), jnp.ones(32), r"signs must have shape \(16,\)"),
  ],
)
def test_bad_signs_are_named(spec, signs, match):
  with pytest.raises(ValueError, match=match):
    pallas_triton.quantize(jnp.ones((16, 64)), spec, signs=signs, interpret=True)


@pytest.mark.parametrize(
  "kwargs, error, match",
  [
    (dict(dequantize=True), ValueError, r"KernelOutput\.dequantize must be None or one of"),
    (dict(along="transposed"), ValueError, r"KernelOutput\.along must be one of \('rows', 'cols'"),
    (dict(trust_mask=1), TypeError, r"KernelOutput\.trust_mask must be a bool"),
    (dict(packed="no"), TypeError, r"KernelOutput\.packed must be a bool"),
    (dict(packed=False, trust_mask=True), ValueError, r"KernelOutput\(packed=False\).*set dequantize"),
  ],
)
def test_bad_output_options_are_named(kwargs, error, match):
  with pytest.raises(error, match=match):
    KernelOutput(**kwargs)


@pytest.mark.parametrize(
  "spec, output, error, match",
  [
    # a valid fp4jax.QuantizeSpec the kernels do not compute: named by its field, before anything is traced
    (fp4jax.QuantizeSpec(fp4jax.E4M3), KernelOutput(), TypeError, r"spec\.fmt must be an FP4Format"),
    (fp4jax.QuantizeSpec(N, clip="occ"), KernelOutput(), ValueError, r"spec\.clip must be 'none'"),
    (fp4jax.QuantizeSpec(N, amax="row"), KernelOutput(), ValueError, r"spec\.amax must be 'tensor'"),
    (fp4jax.QuantizeSpec(N, rounding="eden"), KernelOutput(), ValueError, r"spec\.rounding='eden'.*hadamard=128"),
    # the arguments swapped or mistyped
    (KernelOutput(), fp4jax.QuantizeSpec(N), TypeError, r"spec must be an fp4jax\.QuantizeSpec"),
    (fp4jax.QuantizeSpec(N), "rows", TypeError, r"output must be a KernelOutput"),
  ],
)
@pytest.mark.parametrize("entry", ["kernel", "reference", "api", "pair"])
def test_arguments_the_kernels_do_not_take_are_named(spec, output, error, match, entry):
  x = jnp.ones((32, 64))
  calls = {
    "kernel": lambda: pallas_triton.quantize(x, spec, jax.random.key(0), output=output, interpret=True),
    "reference": lambda: reference.quantize(x, spec, jax.random.key(0), output=output),
    "api": lambda: api.quantize(x, spec, jax.random.key(0), output=output, backend="xla"),
    "pair": lambda: pallas_triton.quantize_pair(
      x, fp4jax.QuantizeSpec(N), spec, rows_output=KernelOutput(), cols_output=output, interpret=True
    ),
  }
  with pytest.raises(error, match=match):
    calls[entry]()


def test_quantizer_fields_are_validated_by_the_core_spec():
  """The kernels take ``fp4jax.QuantizeSpec`` itself: its constructor names the field (no second validation)."""
  with pytest.raises(ValueError, match=r"QuantizeSpec\.rounding='eden' is MS-EDEN for NVFP4"):
    fp4jax.QuantizeSpec(fp4jax.MXFP4, rounding="eden", hadamard=128)
  with pytest.raises(ValueError, match=r"QuantizeSpec\.hadamard must be one of"):
    fp4jax.QuantizeSpec(N, hadamard=24)
  with pytest.raises(ValueError, match=r"QuantizeSpec\.block_shape \(16, 16\).*takes the 2D"):
    fp4jax.QuantizeSpec(M, block_shape=(16, 16))
  job = _k(N, rounding="sr", along="cols", dequantize=D)  # both hashable: static arguments under jit
  assert hash(job) == hash(_k(N, rounding="sr", along="cols", dequantize=D))


def _np_rotation(x: np.ndarray, signs: np.ndarray, d: int, high_bit_first: bool) -> np.ndarray:
  """NumPy's float32 Walsh-Hadamard butterflies of every d-chunk of ``x``'s rows, in place (Sylvester order), one
  index bit per stage: the highest bit first (``fwht``'s order) or the lowest first; then the 1/sqrt(d) scaling."""
  y = x.astype(np.float32).reshape(-1, d) * signs.astype(np.float32)
  stages = range(d.bit_length() - 2, -1, -1) if high_bit_first else range(d.bit_length() - 1)
  for b in stages:
    y = y.reshape(-1, d >> (b + 1), 2, 1 << b)
    a, c = y[:, :, 0, :], y[:, :, 1, :]
    y = np.stack([a + c, a - c], axis=2)
  return (y.reshape(x.shape) * np.float32(1 / np.sqrt(d))).astype(np.float32)


@pytest.mark.parametrize("dtype, shape", [(jnp.bfloat16, (100, 384)), (jnp.float32, (64, 256))])
def test_vector_parts_prepass_adds_in_the_butterflys_order(dtype, shape):
  """MS-EDEN's 128-point pre-pass along the rows (``rotate_vector_parts``, on a ragged shape too) stages the bits
  of NumPy's float32 butterfly taken highest index bit first, rounded to ``x``'s dtype, and reduces their max|.|;
  the data spans 2^±20, so the other order gives other bits (checked: the test sees the order); a NaN makes the
  amax +Inf (the tensor scale then NaN)."""
  spec, output = CASES["nvfp4_ms_eden"][0]
  rng = np.random.default_rng(3)
  x = (rng.standard_normal(shape) * np.exp2(rng.integers(-20, 21, shape))).astype(np.float32)
  x = np.array(jnp.asarray(x, dtype).astype(jnp.float32))  # the values x holds (a writable copy)
  signs = rng.choice([-1.0, 1.0], 128).astype(np.float32)
  staged, amax = pallas_triton.stage_and_amax(jnp.asarray(x, dtype), spec, output, jnp.asarray(signs), interpret=True)
  want = np.asarray(jnp.asarray(_np_rotation(x, signs, 128, True), dtype).astype(jnp.float32))
  other = np.asarray(jnp.asarray(_np_rotation(x, signs, 128, False), dtype).astype(jnp.float32))
  assert (want != other).any()
  np.testing.assert_array_equal(np.asarray(staged.astype(jnp.float32)), want)
  assert float(amax) == np.abs(want).max()
  x[shape[0] - 1, 5] = np.nan
  _, amax = pallas_triton.stage_and_amax(jnp.asarray(x, dtype), spec, output, jnp.asarray(signs), interpret=True)
  assert float(amax) == np.inf
