"""Per-row tensor amax (``OperandSpec.amax="row"``) and ``recipes.causal``: each row quantized as if alone.

Oracles: NumPy's TE-order NVFP4 (``numpy_reference.nvfp4_reference``) and an ml_dtypes FP8 current-scaling
quantizer, applied to one row at a time; and ``fp4jax.quantize.fake_quantize`` of the 1-row tensor.
"""

from __future__ import annotations

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from fp4jax_kernels import operand as kernel_operand

import fp4jax
from fp4jax._src import backends, operand, recipes
from fp4jax._src.flax import linen as ql
from fp4jax._src.flax import nnx as qn
from fp4jax._src.recipes import OperandSpec
from tests.numpy_reference import nvfp4_reference

quantize_mod = importlib.import_module("fp4jax._src.quantize")
F32 = np.float32
DN = (((1,), (0,)), ((), ()))


def _rows(n_rows=6, k=64, seed=0) -> np.ndarray:
  """Rows whose magnitudes differ by up to 2^±12, with a zero row and a row of one outlier."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((n_rows, k)).astype(F32) * np.exp2(rng.integers(-12, 12, (n_rows, 1))).astype(F32)
  x[1] = 0.0
  x[2, 5] = F32(3e4)
  return x


def _bits(a) -> np.ndarray:
  return np.asarray(a, F32).view(np.uint32)


def _row_operand(x, spec, key=None):
  op, _ = operand.quantize_operand(jnp.asarray(x), spec, key, backend="xla")
  return op


# ------------------------------------------------------------------------------------------------ the spec field
def test_amax_field_is_validated_with_its_name():
  with pytest.raises(ValueError, match=r"OperandSpec.amax must be one of \('tensor', 'row'\), got 'token'"):
    OperandSpec(fmt=fp4jax.NVFP4, amax="token")
  with pytest.raises(ValueError, match=r"OperandSpec.amax='row' needs a quantized fmt.*fmt=None"):
    OperandSpec(amax="row")
  with pytest.raises(ValueError, match=r"OperandSpec.amax='row'.*block_shape=\(16, 16\)"):
    OperandSpec(fmt=fp4jax.NVFP4, block_shape=(16, 16), amax="row")
  assert OperandSpec().amax == "tensor"


@pytest.mark.parametrize("name", recipes.names())
def test_causal_variant_changes_only_the_forward_activation_amax(name):
  base = recipes.get(name)
  got = recipes.causal(name)
  if base.fwd_lhs.fmt is None:  # bf16: nothing quantized, nothing to change
    assert got == base
    return
  assert got.name == f"{name}:causal" and got.fwd_lhs.amax == "row"
  assert dataclasses.replace(got.fwd_lhs, amax="tensor") == base.fwd_lhs
  for field in ("fwd_rhs", "dgrad_lhs", "dgrad_rhs", "wgrad_lhs", "wgrad_rhs"):
    assert getattr(got, field) == getattr(base, field), field
  assert recipes.causal(got) is got
  assert recipes.deterministic(got).fwd_lhs.amax == "row"


# ------------------------------------------------------------------------------------------------ per-row bits
def test_nvfp4_row_amax_is_each_row_quantized_alone_numpy_oracle():
  x = _rows()
  op = _row_operand(x, OperandSpec(fmt=fp4jax.NVFP4, amax="row"))
  assert op.scale.shape == (x.shape[0], 1)
  want = np.concatenate([nvfp4_reference(row[None])[3] for row in x])
  want_scales = np.array([[nvfp4_reference(row[None])[2]] for row in x], F32)
  np.testing.assert_array_equal(_bits(op.dequantize()), _bits(want))
  np.testing.assert_array_equal(_bits(op.scale), _bits(want_scales))
  # the per-tensor default is not that: the outlier row sets every row's tensor scale
  tensor = _row_operand(x, OperandSpec(fmt=fp4jax.NVFP4)).dequantize()
  assert not np.array_equal(_bits(tensor), _bits(want))


# slow tier; default representative: test_nvfp4_row_amax_is_each_row_quantized_alone_numpy_oracle (each row
# quantized alone, bit for bit against the NumPy oracle); the slow tier adds leading dims, ragged blocks, 4/6
@pytest.mark.slow
@pytest.mark.parametrize(
  "fmt", [fp4jax.NVFP4, dataclasses.replace(fp4jax.NVFP4, scale_mode="four_over_six")], ids=["absmax", "four_over_six"]
)
@pytest.mark.parametrize("shape", [(6, 64), (2, 3, 40)], ids=["2d", "batched_ragged"])
def test_nvfp4_row_amax_matches_quantize_of_each_row(fmt, shape):
  """Leading dims and a last axis of partial blocks (40 = 2.5 blocks) broadcast the same way."""
  x = _rows(int(np.prod(shape[:-1])), shape[-1], seed=3).reshape(shape)
  got = _row_operand(x, OperandSpec(fmt=fmt, amax="row")).dequantize()
  flat = x.reshape(-1, shape[-1])
  want = np.concatenate([np.asarray(quantize_mod.fake_quantize(row[None], fmt, hadamard=0)) for row in flat])
  np.testing.assert_array_equal(_bits(got).reshape(flat.shape), _bits(want))


def test_non_finite_row_stays_in_its_row():
  x = _rows()
  x[3, 7], x[4, 0] = np.nan, np.inf
  got = np.asarray(_row_operand(x, OperandSpec(fmt=fp4jax.NVFP4, amax="row")).dequantize())
  assert np.all(np.isnan(got[3])) and np.all(np.isnan(got[4]))  # as the 1-row tensor: a NaN tensor scale
  finite = [0, 1, 2, 5]
  want = np.concatenate([nvfp4_reference(x[r][None])[3] for r in finite])
  np.testing.assert_array_equal(_bits(got[finite]), _bits(want))


def _fp8_e4m3_rows(x: np.ndarray) -> np.ndarray:
  """FP8 E4M3 current scaling of each row alone (s = 448/amax_row, RNE, saturating), dequantized: v · f32(1/s)."""
  amax = np.max(np.abs(x), axis=-1, keepdims=True)
  s = np.where(amax == 0, F32(1), F32(448) / np.where(amax == 0, F32(1), amax)).astype(F32)
  v = np.clip(x * s, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(F32)
  return (v * (F32(1) / s)).astype(F32)


def test_fp8_row_amax_numpy_oracle():
  x = _rows()
  op = _row_operand(x, OperandSpec(fmt=fp4jax.formats.E4M3, amax="row"))
  assert op.scale.shape == (x.shape[0], 1)
  np.testing.assert_array_equal(_bits(op.dequantize()), _bits(_fp8_e4m3_rows(x)))
  tensor = _row_operand(x, OperandSpec(fmt=fp4jax.formats.E4M3)).dequantize()
  assert not np.array_equal(_bits(tensor), _bits(_fp8_e4m3_rows(x)))


@pytest.mark.parametrize(
  "spec",
  [
    pytest.param(  # slow tier; default representative: [e2m1_channel_occ] (per-row scales and quantiles)
      OperandSpec(fmt=dataclasses.replace(fp4jax.MXFP4, scale_mode="quest"), estimator="trust_mask"),
      marks=pytest.mark.slow,
    ),
    OperandSpec(fmt=recipes.E2M1_CHANNEL, clip="occ"),
  ],
  ids=["mxfp4_quest", "e2m1_channel_occ"],
)
def test_row_amax_changes_no_bits_where_nothing_is_tensor_wide(spec):
  """MXFP4 (block scales only) and per-channel E2M1 with OCC (per-row scales and quantiles) are per row already;
  a row's result does not depend on the other rows either way."""
  x = _rows()
  a, mask_a = operand.quantize_operand(jnp.asarray(x), spec, None, backend="xla")
  b, mask_b = operand.quantize_operand(jnp.asarray(x), dataclasses.replace(spec, amax="row"), None, backend="xla")
  np.testing.assert_array_equal(_bits(a.dequantize()), _bits(b.dequantize()))
  np.testing.assert_array_equal(np.asarray(mask_a), np.asarray(mask_b))
  alone = np.concatenate([np.asarray(_row_operand(row[None], spec).dequantize()) for row in x])
  np.testing.assert_array_equal(_bits(a.dequantize()), _bits(alone))


# ------------------------------------------------------------------------------------------------ backends
def test_kernels_refuse_row_amax_and_auto_falls_back_to_xla():
  spec = OperandSpec(fmt=fp4jax.NVFP4, amax="row")
  assert "amax='row'" in kernel_operand.refusal((32, 64), jnp.float32, spec, True)
  assert kernel_operand.refusal((32, 64), jnp.float32, OperandSpec(fmt=fp4jax.NVFP4), True) is None
  x = jnp.asarray(_rows(32))
  args = (x, spec, None, None)
  with pytest.raises(backends.Unsupported, match="amax='row'"):
    operand.quantize_operand(x, spec, None, backend="pallas")
  # "auto" on a GPU that runs the kernels tries them first: the refusal falls through to XLA's bits
  got, _ = backends.run(
    operand.QUANTIZE_OP, "auto", *args, fused_hadamard=True, transposed=False, auto=True, order=("pallas", "xla")
  )
  np.testing.assert_array_equal(_bits(got.dequantize()), _bits(_row_operand(x, spec).dequantize()))


# ------------------------------------------------------------------------------------------------ dot_general
def _changed_row(x: np.ndarray, row: int) -> np.ndarray:
  y = x.copy()
  y[row] = y[row] * F32(64.0)  # a larger max|x| in one token
  return y


# slow tier; default representative: [fp8], the cheapest compile: causal() is one mechanism for every recipe (a per-row
# Operand.scale, test_dot.py::test_per_row_scales_scale_the_output_rows_and_columns), and NVFP4's per-row tensor
# scales are each row quantized alone (test_nvfp4_row_amax_is_each_row_quantized_alone_numpy_oracle)
@pytest.mark.parametrize(
  "name",
  [
    n if n == "fp8" else pytest.param(n, marks=pytest.mark.slow)
    for n in ("nvidia_nvfp4", "nvfp4_rtn", "quartet2", "fp8", "ms_fp4")
  ],
)
def test_dot_general_rows_are_independent_under_causal(name):
  """Y = X·W with causal(recipe): scaling up token 5 leaves every other token's output bit-identical; with the
  per-tensor recipe (all but ms_fp4, per-token already) other tokens' outputs move."""
  rng = np.random.default_rng(1)
  x, w = rng.standard_normal((32, 64)).astype(F32), rng.standard_normal((64, 48)).astype(F32)
  other = np.arange(32) != 5
  key = jax.random.key(0)

  def run(recipe, xs):
    return np.asarray(fp4jax.dot_general(jnp.asarray(xs), jnp.asarray(w), DN, recipe=recipe, key=key))

  causal = recipes.causal(name)
  np.testing.assert_array_equal(_bits(run(causal, x)[other]), _bits(run(causal, _changed_row(x, 5))[other]))
  moved = not np.array_equal(run(name, x)[other], run(name, _changed_row(x, 5))[other])
  assert moved == (name != "ms_fp4")


def test_dot_general_forward_and_gradients_with_row_amax_oracle():
  """causal(fp8): Y = E4M3_row(X) · E4M3(W) (per-token and per-tensor current scaling), and the weight gradient
  reuses the per-token-scaled forward X: dW = E4M3_row(X)ᵀ · E5M2(dY). dX = E5M2(dY) · E4M3(W)ᵀ as before."""
  rng = np.random.default_rng(2)
  x = rng.standard_normal((32, 64)).astype(F32) * np.exp2(rng.integers(-6, 6, (32, 1))).astype(F32)
  w, dy = rng.standard_normal((64, 48)).astype(F32), rng.standard_normal((32, 48)).astype(F32)
  recipe = recipes.causal("fp8")
  f = lambda x, w: fp4jax.dot_general(x, w, DN, recipe=recipe)
  y, vjp = jax.vjp(f, jnp.asarray(x), jnp.asarray(w))
  dx, dw = vjp(jnp.asarray(dy))

  def per_tensor(a, fmt, fmax):
    amax = np.max(np.abs(a))
    s = F32(fmax) / amax
    return (np.clip(a * s, -fmax, fmax).astype(fmt).astype(F32) * (F32(1) / s)).astype(F32)

  xq, wq = _fp8_e4m3_rows(x), per_tensor(w.T, ml_dtypes.float8_e4m3fn, 448.0).T
  dyq = per_tensor(dy, ml_dtypes.float8_e5m2, 57344.0)
  np.testing.assert_allclose(np.asarray(y), xq.astype(np.float64) @ wq, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(dw), xq.T.astype(np.float64) @ dyq, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(np.asarray(dx), dyq.astype(np.float64) @ wq.T, rtol=1e-5, atol=1e-4)
  # per-tensor X gives another forward: the oracle tells the two apart
  y_tensor = np.asarray(fp4jax.dot_general(jnp.asarray(x), jnp.asarray(w), DN, recipe="fp8"))
  assert not np.allclose(y_tensor, xq.astype(np.float64) @ wq, rtol=1e-5, atol=1e-5)


# slow tier; default representative: test_dot_general_forward_and_gradients_with_row_amax_oracle (causal fp8: dW
# from the per-token-scaled forward X, dX as without causal, against the oracle)
@pytest.mark.slow
@pytest.mark.parametrize("name", ["nvidia_nvfp4", "quartet2"])
def test_dot_general_gradients_flow_under_causal(name):
  """The per-row scale reaches the backward operands made from the forward tensor (quartet2's X̂ᵀ from the forward
  NVFP4 X) and nothing else: nvidia_nvfp4's backward reads the layer input, so its gradients are the default
  recipe's bit for bit; quartet2's weight gradient changes, its data gradient does not."""
  rng = np.random.default_rng(4)
  x = rng.standard_normal((128, 128)).astype(F32) * np.exp2(rng.integers(-6, 6, (128, 1))).astype(F32)
  w = rng.standard_normal((128, 128)).astype(F32)
  key = jax.random.key(3)
  dy = jnp.asarray(rng.standard_normal((128, 128)).astype(F32))  # one cotangent for both

  def vjp(recipe):
    _, back = jax.vjp(lambda x, w: fp4jax.dot_general(x, w, DN, recipe=recipe, key=key), jnp.asarray(x), jnp.asarray(w))
    return [np.asarray(g) for g in back(dy)]

  (dx_c, dw_c), (dx_t, dw_t) = vjp(recipes.causal(name)), vjp(name)
  assert np.all(np.isfinite(dx_c)) and np.all(np.isfinite(dw_c)) and np.any(dw_c != 0)
  np.testing.assert_array_equal(_bits(dx_c), _bits(dx_t))
  assert np.array_equal(_bits(dw_c), _bits(dw_t)) == (name == "nvidia_nvfp4")


# ------------------------------------------------------------------------------------------------ Flax layers
# slow tier; default representative: test_dot_general_rows_are_independent_under_causal[fp8] (a causal recipe's rows
# in fp4jax.dot_general) and tests/flax/test_flax_layers.py::test_wrappers_match_flax_layers_with_fp4jax_dots (linen
# and nnx layers give fp4jax.dot_general's bits)
@pytest.mark.slow
def test_flax_layers_take_the_causal_recipe():
  """linen Dense and nnx Linear with causal(nvidia_nvfp4): changing one token leaves the others' outputs
  bit-identical; with the recipe's name they move."""
  rng = np.random.default_rng(5)
  x, w = rng.standard_normal((2, 16, 64)).astype(F32), rng.standard_normal((64, 32)).astype(F32)
  x2 = x.copy()
  x2[0, 9] *= F32(64.0)
  other = np.ones((2, 16), bool)
  other[0, 9] = False

  def linen(recipe, xs):
    layer = ql.Dense(32, use_bias=False, recipe=recipe)
    return np.asarray(
      layer.apply({"params": {"kernel": jnp.asarray(w)}}, jnp.asarray(xs), rngs={"quant": jax.random.key(0)})
    )

  def nnx_linear(recipe, xs):
    layer = qn.Linear(64, 32, use_bias=False, recipe=recipe, rngs=nnx.Rngs(0, quant=1))
    layer.kernel[...] = jnp.asarray(w)
    return np.asarray(layer(jnp.asarray(xs)))

  for run in (linen, nnx_linear):
    causal = recipes.causal("nvidia_nvfp4")
    np.testing.assert_array_equal(_bits(run(causal, x)[other]), _bits(run(causal, x2)[other]))
    assert not np.array_equal(run("nvidia_nvfp4", x)[other], run("nvidia_nvfp4", x2)[other])
