"""QuantizeSpec: one spec of a quantizer, validated in its constructor; quantize's spec and keyword forms agree."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax import E4M3, MXFP4, NVFP4, QuantizeSpec, recipes
from fp4jax.recipes import OperandSpec
from tests import oracles

NV46 = dataclasses.replace(NVFP4, scale_mode="four_over_six")
KEY = jax.random.key(3)


@pytest.mark.parametrize(
  "kwargs, error, match",
  [
    (dict(fmt="nvfp4"), TypeError, r"QuantizeSpec\.fmt must be None or a format object"),
    (dict(fmt=NVFP4, block_shape=16), TypeError, r"QuantizeSpec\.block_shape must be None or a tuple of ints"),
    (dict(fmt=NVFP4, block_shape=(32,)), ValueError, r"QuantizeSpec\.block_shape \(32,\).*block size 16"),
    (dict(fmt=MXFP4, block_shape=(16, 16)), ValueError, r"QuantizeSpec\.block_shape \(16, 16\).*takes the 2D"),
    (dict(fmt=NVFP4, block_shape=(16, 16, 16)), ValueError, r"QuantizeSpec\.block_shape must be \(block,\)"),
    (dict(fmt=E4M3, block_shape=(16, 16)), ValueError, r"QuantizeSpec\.block_shape applies to block-scaled fmts"),
    (dict(fmt=NVFP4, rounding="nearest"), ValueError, r"QuantizeSpec\.rounding must be one of \('rtn', 'sr', 'eden'\)"),
    (dict(fmt=E4M3, rounding="sr"), ValueError, r"QuantizeSpec\.rounding='sr' needs an FP4Format"),
    (dict(fmt=MXFP4, rounding="eden"), ValueError, r"QuantizeSpec\.rounding='eden' is MS-EDEN for NVFP4"),
    (dict(fmt=NVFP4, rounding="eden", block_shape=(16, 16)), ValueError, r"QuantizeSpec\.rounding='eden'"),
    (dict(fmt=NV46, rounding="sr"), ValueError, r"QuantizeSpec\.rounding must be 'rtn' with scale_mode"),
    (dict(fmt=NVFP4, hadamard=24), ValueError, r"QuantizeSpec\.hadamard must be one of"),
    (dict(fmt=NVFP4, hadamard="16"), TypeError, r"QuantizeSpec\.hadamard must be an int"),
    (dict(fmt=NVFP4, hadamard=16, signs="fresh"), ValueError, r"QuantizeSpec\.signs must be one of \('none', 'te'"),
    (dict(fmt=NVFP4, hadamard=32, signs="te"), ValueError, r"QuantizeSpec\.signs='te'.*needs hadamard=16"),
    (dict(fmt=E4M3, scale_pow2=1), TypeError, r"QuantizeSpec\.scale_pow2 must be a bool"),
    (dict(fmt=NVFP4, scale_pow2=True), ValueError, r"QuantizeSpec\.scale_pow2 applies to FP8 / E2M1_CHANNEL"),
    (dict(fmt=NVFP4, clip="clamp"), ValueError, r"QuantizeSpec\.clip must be one of \('none', 'occ'\)"),
    (dict(fmt=NVFP4, clip="occ", clip_quantile=0.3), ValueError, r"QuantizeSpec\.clip_quantile must be in \(0\.5, 1\]"),
    (dict(fmt=NVFP4, amax="batch"), ValueError, r"QuantizeSpec\.amax must be one of \('tensor', 'row'\)"),
    (dict(fmt=None, amax="row"), ValueError, r"QuantizeSpec\.amax='row' needs a quantized fmt with 1D blocks"),
  ],
)
def test_each_bad_field_raises_naming_the_field_and_what_it_takes(kwargs, error, match):
  with pytest.raises(error, match=match):
    QuantizeSpec(**kwargs)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(fmt=NVFP4, rounding="sr", estimator="clip"), r"OperandSpec\.estimator must be one of \('ste', 'trust_mask'"),
    (dict(fmt=NVFP4, estimator="dge"), r"OperandSpec\.estimator 'dge' is defined on E2M1_CHANNEL"),
    (dict(fmt=NVFP4, source="weights"), r"OperandSpec\.source must be one of \('input', 'forward'\)"),
    (dict(fmt=NVFP4, rounding="stochastic"), r"OperandSpec\.rounding must be one of"),  # the spec's own fields
  ],
)
def test_operand_spec_is_a_quantize_spec_and_names_its_own_fields(kwargs, match):
  assert issubclass(OperandSpec, QuantizeSpec)
  with pytest.raises(ValueError, match=match):
    OperandSpec(**kwargs)


@pytest.mark.parametrize(
  "spec, error, match",
  [
    (QuantizeSpec(E4M3), TypeError, r"spec\.fmt must be an FP4Format"),
    (QuantizeSpec(), TypeError, r"spec\.fmt must be an FP4Format"),
    (QuantizeSpec(NVFP4, clip="occ"), ValueError, r"spec\.clip must be 'none'"),
    (QuantizeSpec(NVFP4, amax="row"), ValueError, r"spec\.amax must be 'tensor'"),
  ],
)
@pytest.mark.parametrize("fn", [fp4jax.quantize, fp4jax.fake_quantize])
def test_quantize_refuses_a_valid_spec_it_does_not_compute_naming_the_field(fn, spec, error, match):
  with pytest.raises(error, match=match):
    fn(jnp.ones((4, 32)), spec)


@pytest.mark.parametrize("fn", [fp4jax.quantize, fp4jax.fake_quantize])
def test_a_spec_and_keyword_options_together_are_refused(fn):
  with pytest.raises(TypeError, match=r"either a QuantizeSpec or a format with keyword options.*'rounding'"):
    fn(jnp.ones((4, 32)), QuantizeSpec(NVFP4, rounding="sr"), rounding="rtn", key=KEY)


def test_keyword_form_builds_the_spec_with_its_defaults():
  assert QuantizeSpec.of(NVFP4) == QuantizeSpec(NVFP4)  # hadamard "auto" is none for RTN: signs dropped
  assert QuantizeSpec.of(NVFP4, rounding="eden") == QuantizeSpec(NVFP4, rounding="eden", hadamard=128, signs="random")
  assert QuantizeSpec.of(NVFP4, block_shape=[16]) == QuantizeSpec(NVFP4)  # (block_size,) is 1D blocks: None
  with pytest.raises(ValueError, match=r"QuantizeSpec\.signs must be one of"):
    QuantizeSpec.of(NVFP4, hadamard_signs="fresh")


# slow tier; default representative: [spec0-kwargs0] (SR with random Hadamard signs: the key's bits and signs)
@pytest.mark.parametrize(
  "spec, kwargs",
  [
    (QuantizeSpec(NVFP4, rounding="sr", hadamard=16, signs="random"), dict(rounding="sr", hadamard=16)),
    pytest.param(
      QuantizeSpec(NVFP4, rounding="eden", hadamard=128, signs="random"), dict(rounding="eden"), marks=pytest.mark.slow
    ),
    pytest.param(
      QuantizeSpec(MXFP4, hadamard=32, signs="none"), dict(hadamard=32, hadamard_signs="none"), marks=pytest.mark.slow
    ),
    pytest.param(
      recipes.nvidia_nvfp4().fwd_rhs, dict(block_shape=(16, 16)), marks=pytest.mark.slow
    ),  # a recipe's operand is a spec
  ],
)
def test_spec_form_equals_keyword_form_bit_for_bit(spec, kwargs):
  x = jax.random.normal(jax.random.key(1), (256, 48)) * 3.0
  a = fp4jax.quantize(x, spec, key=KEY, axis=0)
  b = fp4jax.quantize(x, spec.fmt, key=KEY, axis=0, **kwargs)
  for field in ("codes", "scales", "global_scale", "signs"):
    u, v = getattr(a, field), getattr(b, field)
    assert (u is None) == (v is None), field
    if u is not None:
      u, v = np.asarray(u), np.asarray(v)
      assert (u.dtype, u.shape, u.tobytes()) == (v.dtype, v.shape, v.tobytes()), field
  np.testing.assert_array_equal(
    np.asarray(fp4jax.fake_quantize(x, spec, key=KEY, axis=0)),
    np.asarray(fp4jax.fake_quantize(x, spec.fmt, key=KEY, axis=0, **kwargs)),
  )


def test_spec_form_equals_the_numpy_oracle_on_2d_tiles():
  """NVIDIA's forward weight operand (NVFP4 16x16 tiles) quantized by its spec: the oracle ``oracles.nvfp4``."""
  rng = np.random.default_rng(0)
  w = (rng.standard_normal((32, 64)) * np.exp2(rng.integers(-6, 7, (32, 1)))).astype(np.float32)
  spec = recipes.nvidia_nvfp4().fwd_rhs
  assert spec.block_shape == (16, 16)
  vals, s_dec, dec = oracles.nvfp4(w, tiles=True)
  q = fp4jax.quantize(w, spec)
  np.testing.assert_array_equal(np.asarray(q.scales.astype(jnp.float32)), dec)
  np.testing.assert_array_equal(np.asarray(q.global_scale), s_dec)
  want = oracles.fl(oracles.fl(vals) * s_dec)
  np.testing.assert_array_equal(np.asarray(q.dequantize(jnp.float32)), want)
  np.testing.assert_array_equal(np.asarray(fp4jax.fake_quantize(w, spec, dtype=jnp.float32)), want)


def test_fixed_signs_need_no_key_and_are_the_runs_constant_vector():
  """``signs="fixed"``: the Rademacher vector of the key ``FIXED_SIGNS_SEED`` (what recipes.deterministic uses)."""
  q = fp4jax.quantize(jnp.ones((4, 32)), QuantizeSpec(NVFP4, hadamard=16, signs="fixed"))
  want = jax.random.rademacher(jax.random.key(0x5EED5), (16,), jnp.float32)
  np.testing.assert_array_equal(np.asarray(q.signs), np.asarray(want))


# slow tier; default representative: [quantize] (both functions resolve their arguments in quantize._spec_of)
@pytest.mark.parametrize("fn", [fp4jax.quantize, pytest.param(fp4jax.fake_quantize, marks=pytest.mark.slow)])
def test_the_format_by_keyword_is_the_keyword_form_and_once_only(fn):
  x = jax.random.normal(jax.random.key(2), (4, 64))
  a = fn(x, fmt=MXFP4, rounding="sr", key=KEY)
  b = fn(x, QuantizeSpec(MXFP4, rounding="sr"), key=KEY)
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(u).astype(np.float32), np.asarray(v).astype(np.float32))
  with pytest.raises(TypeError, match="once"):
    fn(x, NVFP4, fmt=NVFP4)
  with pytest.raises(TypeError, match="once"):
    fn(x)
