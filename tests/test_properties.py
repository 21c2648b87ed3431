"""Property tests (hypothesis) and statistical tests of the quantizers."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fp4jax
from fp4jax._src import metrics

NV, MX = fp4jax.NVFP4, fp4jax.MXFP4
FOUR_SIX = dataclasses.replace(NV, scale_mode="four_over_six")
RCEIL = dataclasses.replace(MX, scale_mode="rceil")
SHAPE = (4, 64)

# Magnitudes below 1e-30 are left out: their dequantized values are float32 subnormals, which XLA flushes to zero.
finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32, allow_subnormal=False).filter(
  lambda v: v == 0 or abs(v) > 1e-30
)
tensors = hnp.arrays(np.float32, SHAPE, elements=finite)
settings.register_profile("fp4jax", max_examples=40, deadline=None)
settings.load_profile("fp4jax")


# slow tier; default representative: [fmt0] (MXFP4's own floor scales; rceil's error bound: test_mxfp4_rceil_*)
@given(tensors)
@pytest.mark.parametrize("fmt", [MX, pytest.param(RCEIL, marks=pytest.mark.slow)])
def test_mx_quantize_is_idempotent(fmt, x):
  """Power-of-two block scales are reproduced from a dequantized block, so Q(Q(x)) = Q(x)."""
  y = fp4jax.fake_quantize(x, fmt)
  np.testing.assert_array_equal(np.asarray(fp4jax.fake_quantize(y, fmt)), np.asarray(y))


@given(tensors)
def test_nvfp4_element_rounding_is_idempotent(x):
  """Re-rounding the codes' values with the same scales returns the same codes (NVFP4's E4M3 scale is re-derived
  from the dequantized amax, so whole-tensor idempotence is not a property of the format)."""
  codes = fp4jax.quantize(x, NV).unpacked_codes()
  again = fp4jax.rounding.rtn_e2m1(fp4jax._src.formats.e2m1_decode(codes))
  np.testing.assert_array_equal(np.asarray(again), np.where(np.asarray(codes) == 8, 0, np.asarray(codes)))  # -0 -> +0


# slow tier; default representative: [fmt2] (four-over-six: NVFP4's scales and its choice of 4 or 6 per block)
@given(hnp.arrays(np.float32, (16,), elements=finite))
@pytest.mark.parametrize(
  "fmt", [pytest.param(NV, marks=pytest.mark.slow), pytest.param(MX, marks=pytest.mark.slow), FOUR_SIX]
)
def test_monotone_within_a_block(fmt, x):
  x = np.sort(x)[None]
  y = np.asarray(fp4jax.fake_quantize(x, fmt))[0]
  assert np.all(np.diff(y) >= 0)


@given(tensors)
def test_nvfp4_error_bound(x):
  """|x − Q(x)| <= dec_b · s_dec for blocks with a normal E4M3 scale: half the widest E2M1 gap (1) in scaled units,
  and clipping is at most 6·(1/15) because the E4M3 scale is within 2^-4 of amax_b·s_enc/6."""
  q = fp4jax.quantize(x, NV)
  dec = np.asarray(q.scales).astype(np.float32).repeat(16, axis=-1)
  bound = dec * np.float32(q.global_scale) * (1 + 1e-6)
  err = np.abs(x - np.asarray(q.dequantize(jnp.float32)))
  normal = dec >= 2.0**-6
  assert np.all(err[normal] <= bound[normal])


@given(tensors)
def test_mxfp4_rceil_error_bound(x):
  """No clipping with "rceil": |x − Q(x)| <= 2^e · 1 (half the widest gap)."""
  q = fp4jax.quantize(x, RCEIL)
  s = np.asarray(q.scale_values()).repeat(32, axis=-1)
  assert np.all(np.abs(x - np.asarray(q.dequantize(jnp.float32))) <= s)


# slow tier; default representative: test_oracles_numerics.py's test_four_over_six_picks_each_candidate_and_keeps_6_*
# and test_four_over_six_matches_the_oracle_on_random_blocks (the lower-error scale of 4 and 6 per block, bit for bit)
@pytest.mark.slow
@given(tensors)
def test_four_over_six_never_worse_per_block(x):
  a = np.asarray(fp4jax.fake_quantize(x, FOUR_SIX)).reshape(4, 4, 16)
  s = np.asarray(fp4jax.quantize(x, FOUR_SIX).global_scale)
  # Quantize with the plain "max -> 6" scale rule but the same tensor scale, then compare the per-block errors.
  from fp4jax._src import scaling

  xb = jnp.asarray(x).reshape(4, 4, 16)
  amax = jnp.max(jnp.abs(xb))
  s_enc, s_dec = scaling.nvfp4_tensor_scales(amax, "four_over_six")
  dec, enc = scaling.nvfp4_block_scales(jnp.max(jnp.abs(xb), -1, keepdims=True), s_enc, s_dec)
  b = fp4jax._src.formats.e2m1_decode(fp4jax.rounding.rtn_e2m1(jnp.clip(xb * enc, -6, 6))) * dec * s_dec
  assert np.float32(s) == np.float32(s_dec)
  err = lambda y: ((np.asarray(xb, np.float64) - y) ** 2).sum(-1)
  assert np.all(err(a) <= err(np.asarray(b)) * (1 + 1e-5) + 1e-30)


SAMPLES = (256, 2048)  # two sample sizes, each of its own keys: split(key(n), n)


def _samples(f):
  """``f`` (vmapped over keys) of the ``SAMPLES`` sizes' keys, as float64: one call on the keys concatenated, so one
  compile for both sizes (each sample is its own key's)."""
  keys = [jax.random.split(jax.random.key(n), n) for n in SAMPLES]
  return np.split(np.asarray(f(jnp.concatenate(keys)), np.float64), [SAMPLES[0]])


def _chi2_unbiased(samples, x):
  """Sum over elements of (mean − x)² / (s²/N) and its degrees of freedom (elements with s² > 0)."""
  n = samples.shape[0]
  m = samples.mean(0)
  v = samples.var(0, ddof=1)
  ok = v > 0
  return float(np.sum((m[ok] - x[ok]) ** 2 / (v[ok] / n))), int(ok.sum())


# slow tier; default representative: [fmt0] (NVFP4; the same SR rounding: test_rounding.py's test_sr_e2m1_*)
@pytest.mark.parametrize("fmt", [NV, pytest.param(MX, marks=pytest.mark.slow)])
def test_sr_quantizer_is_unbiased_at_two_sample_sizes(fmt):
  """E_key[Q_sr(x)] = x: chi² of the mean against x within 5 sigma at N = 256 and 2048, max error shrinking ~ 1/sqrt(N).

  Inputs stay below the clipping point (each row's max is 6 on the scaled grid), where SR is exactly unbiased.
  """
  x = np.asarray(jax.random.normal(jax.random.key(0), (2, 128)), np.float32)
  x = np.clip(x, -2.5, 2.5)
  x[:, ::32] = 2.5  # every block's max is the same exact value, so no element of any block clips
  f = jax.jit(jax.vmap(lambda k: fp4jax.fake_quantize(x, fmt, rounding="sr", key=k)))
  errs = []
  for n, s in zip(SAMPLES, _samples(f)):
    chi2, dof = _chi2_unbiased(s, x.astype(np.float64))
    assert abs(chi2 - dof) < 5 * np.sqrt(2 * dof), (n, chi2, dof)
    errs.append(np.sqrt(np.mean((s.mean(0) - x) ** 2)))
  assert errs[1] < errs[0] / np.sqrt(8) * 1.5


def test_ms_eden_is_unbiased_and_rtn_is_not():
  """MS-EDEN with RHT-128: mean over keys converges to x (chi² within 5 sigma at N=256 and 2048), and the mean
  misalignment is within 4 standard errors of 0; RTN after the same random rotation keeps a bias floor."""
  x = np.asarray(jax.random.normal(jax.random.key(0), (4, 256)) * jnp.array([1.0, 3.0, 100.0, 0.01])[:, None])
  f = jax.jit(jax.vmap(lambda k: fp4jax.fake_quantize(x, NV, rounding="eden", key=k)))
  g = jax.jit(jax.vmap(lambda k: fp4jax.fake_quantize(x, NV, hadamard=128, key=k)))
  xx = float(np.sum(x.astype(np.float64) ** 2))
  for n, s in zip(SAMPLES, _samples(f)):
    chi2, dof = _chi2_unbiased(s, x.astype(np.float64))
    assert abs(chi2 - dof) < 5 * np.sqrt(2 * dof), (n, chi2, dof)
    mis = 1 - (s * x).sum((1, 2)) / xx
    assert abs(mis.mean()) < 4 * mis.std() / np.sqrt(n) + 1e-5
  r = np.asarray(g(jax.random.split(jax.random.key(9), 2048)), np.float64)
  chi2, dof = _chi2_unbiased(r, x.astype(np.float64))
  assert chi2 > dof + 20 * np.sqrt(2 * dof), (chi2, dof)


def test_metrics_definitions():
  x = jnp.array([3.0, 4.0])
  q = jnp.array([3.0, 3.0])
  assert float(metrics.relative_mse(x, q)) == pytest.approx(1 / 25)
  assert float(metrics.snr_bits(x, q)) == pytest.approx(-0.5 * np.log2(1 / 25))
  assert float(metrics.misalignment(x, q)) == pytest.approx(1 - 21 / 25)
  assert float(metrics.cosine(x, q)) == pytest.approx(21 / (5 * np.sqrt(18)))
