"""MXFP8 and FP8 block scaling (``fp4jax.MXFP8``, ``fp4jax.FP8_BLOCK``) bit for bit against the NumPy oracles
(``tests/oracles.py``: ``mxfp8``, ``fp8_block``, written from OCP MX v1.0 and DeepSeek-V3, E4M3 by ml_dtypes).

Covered: random data over the whole float32 range (subnormal inputs and scales included), every E4M3 midpoint after
scaling (ties to even), saturation, partial (zero-padded) blocks, all-zero blocks, NaN / Inf blocks, 2D 128x128
blocks along either axis, jit against eager, and the kernels' refusal of these formats.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp4jax
from fp4jax._src import backends, operand
from fp4jax._src.recipes import OperandSpec
from tests import oracles

F32 = np.float32
MX_MODES = ["floor", "rceil"]
E4M3_GRID = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)))
E4M3_GRID = E4M3_GRID[np.isfinite(E4M3_GRID)]  # 0, 2^-9, ..., 448


def _bits(a) -> np.ndarray:
  """float32 bit patterns (NaN payloads normalized), so -0.0, subnormals and NaN compare exactly."""
  a = np.asarray(a, np.float32)
  return np.where(np.isnan(a), np.uint32(0x7FC00000), a.view(np.uint32))


def _mx(mode):
  return dataclasses.replace(fp4jax.MXFP8, scale_mode=mode)


def _library(x, fmt, axis=-1, block_shape=None):
  """(elements as float32, scales, dequantized) from the public API."""
  e, s = fp4jax.fp8.quantize_blocks(x, fmt, axis=axis, block_shape=block_shape)
  y = fp4jax.fp8.fake_quantize_blocks(x, fmt, axis=axis, block_shape=block_shape)
  assert e.dtype == jnp.float8_e4m3fn and s.dtype == fmt.scale_dtype and y.dtype == jnp.asarray(x).dtype
  return np.asarray(e).astype(np.float32), np.asarray(s), np.asarray(y)


def _oracle(x, fmt, axis=-1, tiles=False):
  """The oracle along ``axis``: (elements, scales (E8M0 bits or float32), dequantized float32)."""
  xt = np.moveaxis(np.asarray(x, F32), axis, -1)
  if isinstance(fmt, fp4jax.MXFP8Format):
    v, s, d = oracles.mxfp8(xt, fmt.scale_mode, fmt.block_size)
  else:
    v, s, d = oracles.fp8_block(xt, fmt.block_size, tiles)
  if tiles:  # 2D blocks: the scale grid's dims follow x's last two dims
    s = np.swapaxes(s, -1, -2) if axis % np.ndim(x) == np.ndim(x) - 2 else s
  else:
    s = np.moveaxis(s, -1, axis)
  return np.moveaxis(v, -1, axis), s, np.moveaxis(np.asarray(d, F32), -1, axis)


def _assert_same(x, fmt, axis=-1, block_shape=None):
  got = _library(x, fmt, axis, block_shape)
  want = _oracle(x, fmt, axis, tiles=block_shape is not None)
  np.testing.assert_array_equal(_bits(got[0]), _bits(want[0]), err_msg="elements")
  scales = got[1].view(np.uint8) if isinstance(fmt, fp4jax.MXFP8Format) else _bits(got[1])
  np.testing.assert_array_equal(scales, want[1] if isinstance(fmt, fp4jax.MXFP8Format) else _bits(want[1]))
  np.testing.assert_array_equal(_bits(got[2]), _bits(want[2]), err_msg="dequantized")
  return got


def _wide_range(seed, shape):
  """N(0,1) rows scaled by 2^k, k uniform in [-150, 120]: tiny rows hold float32 subnormals (and subnormal FP8_BLOCK
  scales or scales that underflow), huge rows values near FLT_MAX."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=shape) * np.exp2(rng.integers(-150, 121, size=shape[:-1] + (1,)))
  return x.astype(F32)


FORMATS = [_mx("floor"), _mx("rceil"), fp4jax.FP8_BLOCK]
IDS = ["mxfp8_floor", "mxfp8_rceil", "fp8_block"]


_SLOW = pytest.mark.slow


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize(  # slow tier; default representative: shape3 ((2, 7, 200) along the middle axis, ragged)
  "shape, axis",
  [
    pytest.param((64, 256), -1, marks=_SLOW),
    pytest.param((3, 45), -1, marks=_SLOW),
    pytest.param((300, 5), 0, marks=_SLOW),
    ((2, 7, 200), 1),
  ],
)
def test_random_data_over_the_float32_range_matches_the_oracle(fmt, shape, axis):
  """Partial blocks (45, 300, 200 are no multiples of 32 / 128) are zero-padded as in the oracle."""
  got = _assert_same(_wide_range(1, shape), fmt, axis)
  assert np.any(got[0] != 0) and np.all(np.isfinite(got[2]))


@pytest.mark.parametrize("axis", [-1, -2])
def test_fp8_block_128x128_blocks_match_the_oracle(axis):
  x = _wide_range(2, (2, 200, 300))
  x = x / np.max(np.abs(x), axis=(-2, -1), keepdims=True).clip(1e-30)  # a block's rows span one magnitude
  x = (x * np.exp2(np.arange(-140, 60, 1.0))[:, None]).astype(F32)  # ... and the blocks very different ones
  _assert_same(x, fp4jax.FP8_BLOCK, axis, block_shape=(128, 128))


def test_fp8_block_2d_blocks_are_the_same_for_w_and_its_transpose():
  """A 128x128 block grid does not depend on the axis: W along its rows equals Wᵀ along its rows, transposed."""
  w = _wide_range(3, (256, 384))
  a = fp4jax.fp8.fake_quantize_blocks(w, fp4jax.FP8_BLOCK, axis=-1, block_shape=(128, 128))
  b = fp4jax.fp8.fake_quantize_blocks(w.T, fp4jax.FP8_BLOCK, axis=-1, block_shape=(128, 128))
  np.testing.assert_array_equal(_bits(a), _bits(np.asarray(b).T))


def _midpoints():
  """Every midpoint between consecutive positive E4M3 values (2^-10 ... 432) and the tie-to-even answer by hand:
  the neighbour with the even code (E4M3 magnitudes are ordered like their codes, so the code is the index)."""
  lo, hi = E4M3_GRID[:-1], E4M3_GRID[1:]
  lo_code = np.arange(lo.size)
  return (lo + hi) / 2, np.where(lo_code % 2 == 0, lo, hi)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_every_e4m3_midpoint_after_scaling_ties_to_even(fmt):
  """Blocks whose amax is 448·2^k: MXFP8 (both modes) takes e = k, FP8_BLOCK dec = 2^k (exact), so x = m·2^k
  scales exactly to the midpoint m; each rounds to its even neighbour (by hand), ± signs, as the oracle."""
  mids, want = _midpoints()
  k = -20
  per = fmt.block_size - 1
  n = -(-mids.size // per)
  vals = np.zeros((n, per))
  vals.flat[: mids.size] = mids
  signs = np.where(np.arange(vals.size).reshape(vals.shape) % 2 == 0, 1.0, -1.0)
  x = np.concatenate([np.full((n, 1), 448.0), vals * signs], axis=1) * 2.0**k
  got = _assert_same(x.astype(F32), fmt)
  elems = got[0][:, 1:].reshape(-1)[: mids.size]
  np.testing.assert_array_equal(np.abs(elems), want)
  np.testing.assert_array_equal(np.signbit(elems), signs.reshape(-1)[: mids.size] < 0)
  assert np.all(got[0][:, 0] == 448.0)


def test_mxfp8_floor_saturates_and_rceil_does_not():
  """amax 511 = 1.996·2^8: "floor" e = 0 (511 -> 448, clipped), "rceil" e = 1 (511/2 = 255.5 -> 256)."""
  x = np.zeros((1, 32), F32)
  x[0, :3] = [511.0, -500.0, 3.0]
  e_floor = _assert_same(x, _mx("floor"))
  e_rceil = _assert_same(x, _mx("rceil"))
  np.testing.assert_array_equal(e_floor[0][0, :3], [448.0, -448.0, 3.0])
  np.testing.assert_array_equal(e_rceil[0][0, :3], [256.0, -256.0, 1.5])
  assert e_floor[1].view(np.uint8)[0, 0] == 127 and e_rceil[1].view(np.uint8)[0, 0] == 128


def test_mxfp8_rceil_equals_transformer_engines_fp32_formula_on_every_significand():
  """The exact rule (smallest e with 448·2^e >= amax) equals TE's ``ceil(log2(f32(amax · f32(1/448))))`` (cvt.rp to
  E8M0) for all 2^23 significands of amax in [1, 2) (and so at every exponent away from E8M0's ends), in NumPy."""
  amax = (np.arange(2**23, dtype=np.uint32) | np.uint32(0x3F800000)).view(F32)
  te = amax * F32(1.0 / 448.0)  # one float32 rounding, as TE's kernel
  m, ex = np.frexp(te.astype(np.float64))
  te_e = ex - 1 + (m != 0.5)  # ceil(log2 te)
  lib = np.asarray(_mx("rceil").exponents(jnp.asarray(amax)))
  np.testing.assert_array_equal(lib, te_e)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_all_zero_blocks(fmt):
  """An all-zero block (and one of -0.0) gives zero elements with their sign, scale 2^-127 (E8M0 0x00) for MXFP8 and
  1.0 for FP8_BLOCK; the other blocks are unaffected."""
  x = np.zeros((3, 2 * fmt.block_size), F32)
  x[1] = -0.0
  x[2, 0] = 5.0
  got = _assert_same(x, fmt)
  assert np.all(got[0][:2] == 0) and np.all(np.signbit(got[0][1]))
  zero_scale = 0 if isinstance(fmt, fp4jax.MXFP8Format) else F32(1.0).view(np.uint32)
  scales = got[1].view(np.uint8) if isinstance(fmt, fp4jax.MXFP8Format) else got[1].view(np.uint32)
  assert np.all(scales[:2] == zero_scale) and scales[2, 1] == zero_scale


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_subnormal_inputs_elements_and_scales(fmt):
  """Blocks of float32 subnormals and of tiny normals: E4M3 subnormal elements (2^-9 steps after scaling) and, for
  FP8_BLOCK, subnormal scales and one whose quotient underflows (2^-149); dequantized values subnormal too."""
  tiny = np.float32(2.0**-149)
  rows = [
    np.arange(1, 33) * 2.0**-140,  # normal amax 32·2^-140
    np.arange(1, 33) * tiny,  # all subnormal
    np.r_[200.0, np.zeros(31)] * tiny,  # amax 200·2^-149: amax/448 underflows
    np.r_[448.0, 3 * 2.0**-10, 2.0**-10, 5 * 2.0**-10, np.zeros(28)] * 2.0**-100,  # E4M3 subnormal midpoints
  ]
  x = np.stack([np.resize(r, fmt.block_size) for r in rows]).astype(F32)
  got = _assert_same(x, fmt)
  np.testing.assert_array_equal(got[0][3, 1:4], [2.0**-8, 0.0, 2.0**-8])  # ties to even: 2^-9 has an odd code
  assert np.any((got[2] != 0) & (np.abs(got[2]) < 2.0**-126))  # subnormal dequantized values are kept
  if not isinstance(fmt, fp4jax.MXFP8Format):
    assert got[1][2, 0] == tiny and 0 < got[1][1, 0] < 2.0**-126


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_blocks_become_nan_never_finite(fmt, bad):
  """A block holding NaN or ±Inf: NaN scale (E8M0 0xFF / float32 NaN), every element and dequantized value NaN
  (E4M3 has no Inf); the other blocks as without it."""
  x = _wide_range(4, (2, 2 * fmt.block_size))
  x[0, 3] = bad
  got = _assert_same(x, fmt)
  assert np.all(np.isnan(got[0][0, : fmt.block_size])) and np.all(np.isnan(got[2][0, : fmt.block_size]))
  scale = got[1][0, 0]
  assert (scale.view(np.uint8) == 0xFF) if isinstance(fmt, fp4jax.MXFP8Format) else np.isnan(scale)
  assert np.all(np.isfinite(got[2][0, fmt.block_size :])) and np.all(np.isfinite(got[2][1]))


@pytest.mark.parametrize(  # slow tier; default representative: [mxfp8_floor] (the op-by-op program of one format)
  "fmt", [f if i == "mxfp8_floor" else pytest.param(f, marks=_SLOW) for f, i in zip(FORMATS, IDS)], ids=IDS
)
def test_same_bits_under_jit_and_eagerly(fmt):
  x = jnp.asarray(_wide_range(5, (4, 300)))
  jitted = _library(x, fmt)
  with jax.disable_jit():
    eager = _library(x, fmt)
  for a, b in zip(jitted, eager):
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_bf16_and_f16_inputs_quantize_their_values():
  x = _wide_range(6, (4, 64)) * np.float32(1e-30) ** 0  # finite in f16 after clipping below
  x = np.clip(x, -6e4, 6e4)
  for dtype in (jnp.bfloat16, jnp.float16):
    xd = jnp.asarray(x, dtype)
    got = _library(xd, fp4jax.FP8_BLOCK)
    want = _oracle(np.asarray(xd.astype(jnp.float32)), fp4jax.FP8_BLOCK)
    np.testing.assert_array_equal(_bits(got[0]), _bits(want[0]))
    assert got[2].dtype == dtype


@pytest.mark.parametrize(
  "call, error, match",
  [
    (lambda: fp4jax.fp8.quantize_blocks(jnp.ones((4, 32)), fp4jax.MXFP4), TypeError, "BlockFP8Format"),
    (lambda: fp4jax.fp8.quantize_blocks(jnp.ones((4, 32)), fp4jax.MXFP8, block_shape=(32, 32)), ValueError, "2D"),
    (
      lambda: fp4jax.fp8.quantize_blocks(jnp.ones((128,)), fp4jax.FP8_BLOCK, block_shape=(128, 128)),
      ValueError,
      "ndim",
    ),
    (lambda: fp4jax.fp8.quantize_blocks(jnp.ones((4, 0)), fp4jax.MXFP8), ValueError, "empty"),
    (lambda: fp4jax.fp8.quantize_blocks(jnp.ones((4, 8)), fp4jax.MXFP8, axis=2), ValueError, "axis"),
    (lambda: fp4jax.fp8.quantize_blocks(jnp.ones((4, 8), jnp.int32), fp4jax.MXFP8), TypeError, "floating"),
    (lambda: OperandSpec(fmt=fp4jax.MXFP8, rounding="sr"), ValueError, "rounding"),
    (lambda: fp4jax.MXFP8Format(scale_mode="quest"), ValueError, "MXFP8Format.scale_mode"),
    (lambda: fp4jax.FP8BlockFormat(block_size=0), ValueError, "FP8BlockFormat.block_size"),
    (lambda: fp4jax.quantize(jnp.ones((4, 32)), fp4jax.MXFP8), TypeError, "FP4Format"),
  ],
)
def test_bad_arguments_raise_naming_them(call, error, match):
  with pytest.raises(error, match=match):
    call()


@pytest.mark.parametrize(  # slow tier; default representative: [fmt0] (MXFP8; both formats are BlockFP8Format)
  "fmt", [fp4jax.MXFP8, pytest.param(fp4jax.FP8_BLOCK, marks=_SLOW)]
)
def test_the_kernels_refuse_these_formats_and_auto_falls_back(fmt):
  """The fused quantize kernel raises ``backends.Unsupported`` for block-scaled FP8 (named backend: no fallback);
  ``"auto"`` gives the XLA operand (on this CPU XLA is the only candidate; on a GPU the refusal sends it there)."""
  x = jnp.asarray(np.random.default_rng(7).normal(size=(128, 256)).astype(F32))  # no subnormal operand values
  spec = OperandSpec(fmt=fmt)
  with pytest.raises(backends.Unsupported, match="block-scaled FP4 only"):
    operand.quantize_operand(x, spec, None, backend="pallas")
  op, _ = operand.quantize_operand(x, spec, None, backend="auto")
  want = _oracle(np.asarray(x), fmt)[2]
  assert op.values.dtype == fmt.gemm_dtype and float(op.scale) == 1.0
  np.testing.assert_array_equal(_bits(np.asarray(op.values.astype(jnp.float32))), _bits(want))


def _odd_block_cases():
  """(fmt, block): by default each format with one of the odd sizes (1, 3, 33), each size once."""
  slow = _SLOW  # slow tier; default representative: [mxfp8_floor-1], [mxfp8_rceil-3], [fp8_block-33]
  keep = {("mxfp8_floor", 1), ("mxfp8_rceil", 3), ("fp8_block", 33)}
  return [
    pytest.param(f, b, marks=() if (i, b) in keep else slow, id=f"{i}-{b}")
    for f, i in zip(FORMATS, IDS)
    for b in (1, 3, 33)
  ]


@pytest.mark.parametrize("fmt, block", _odd_block_cases())
def test_odd_block_sizes_are_blocks_like_any_other(fmt, block):
  """``BlockFormat.block_size`` is any positive int for E4M3 elements (no pairs to pack, unlike E2M1): odd blocks,
  and one-element blocks (a scale per element), match the oracle, the last block zero-padded."""
  f = dataclasses.replace(fmt, block_size=block)
  assert f.block_size == block
  _assert_same(_wide_range(8, (3, 2 * block + 1)), f)


def test_default_blocks_are_the_specs_32_and_128_by_hand():
  """OCP MX v1.0: MXFP8 shares one E8M0 scale per 32 elements; DeepSeek-V3: FP8 block scaling one float32 scale per
  128. Two neighbouring blocks of different amax, hand-computed: MXFP8 amax 1 -> e = 0 - 8 (bits 119), amax 2^10 ->
  e = 2 (bits 129); FP8_BLOCK amax 448 -> dec 1, amax 896 -> dec 2."""
  x = np.zeros((1, 64), F32)
  x[0, 0], x[0, 32] = 1.0, 1024.0
  e, s = fp4jax.fp8.quantize_blocks(jnp.asarray(x), fp4jax.MXFP8)
  np.testing.assert_array_equal(np.asarray(s).view(np.uint8), [[119, 129]])
  np.testing.assert_array_equal(np.asarray(e).astype(F32)[0, [0, 32]], [256.0, 256.0])
  x = np.zeros((1, 256), F32)
  x[0, 0], x[0, 128] = 448.0, -896.0
  e, s = fp4jax.fp8.quantize_blocks(jnp.asarray(x), fp4jax.FP8_BLOCK)
  np.testing.assert_array_equal(np.asarray(s), [[1.0, 2.0]])
  np.testing.assert_array_equal(np.asarray(e).astype(F32)[0, [0, 128]], [448.0, -448.0])


def test_block_fp8_repr_names_the_format_then_its_fields():
  """The documented repr (``Format``'s docstring): the class, ``name=`` first, then every field in order."""
  assert repr(fp4jax.MXFP8) == "MXFP8Format(name='mxfp8_e4m3', block_size=32, scale_mode='floor')"
  assert repr(fp4jax.FP8BlockFormat(block_size=64)) == "FP8BlockFormat(name='fp8_e4m3_block', block_size=64)"
