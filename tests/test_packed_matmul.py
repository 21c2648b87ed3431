"""``fp4jax.packed_matmul`` (XLA reference, errors, differentiation), ``fp4jax.flax.packed.apply`` (linen) and
``apply_nnx`` (NNX), against NumPy decodes of the packed codes and against the quantized model run on the unpacked
weights."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fp4jax
from fp4jax import flax as fq

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
U = 2.0**-24  # fp32 unit roundoff


def np_dequantize_k_rows(q):
  """NumPy float64 decode of a 2-D QTensor with 1-D blocks and no Hadamard, (K, N) along axis 0 or (M, K) along
  axis 1 (OCP / NVIDIA layout: the even element of each pair in the low nibble; value · block scale · tensor
  scale)."""
  codes, scales = np.asarray(q.codes).astype(np.int64), np.asarray(q.scale_values(), np.float64)
  codes, scales = (codes, scales) if q.axis == 0 else (codes.T, scales.T)  # (K/2, N), (K/block, N)
  nib = np.stack([codes & 0xF, codes >> 4], axis=1).reshape(2 * codes.shape[0], codes.shape[1])
  vals = np.where(nib & 8, -1.0, 1.0) * E2M1[nib & 7]
  out = vals * np.repeat(scales, q.fmt.block_size, axis=0)[: vals.shape[0]] * float(q.global_scale)
  return out if q.axis == 0 else out.T


def _w(k=64, n=24, fmt=fp4jax.NVFP4, **kw):
  return fp4jax.quantize(jax.random.normal(jax.random.key(1), (k, n)), fmt, axis=0, **kw)


def _bound(a, b):
  """|fp32 dot error| <= K·u·Σ|a||b| (plus one rounding of each dequantized element) for operands a (.., K),
  b (K, N)."""
  return (a.shape[-1] + 2) * U * (np.abs(a) @ np.abs(b)) + 1e-30


# slow tier; default representative: [mxfp4] (NVFP4 weights: the tests below, e.g. test_gradient_wrt_x_is_*)
@pytest.mark.parametrize(
  "fmt", [pytest.param(fp4jax.NVFP4, marks=pytest.mark.slow), fp4jax.MXFP4], ids=lambda f: f.name
)
def test_weight_only_product_is_x_times_the_decoded_weight(fmt):
  w = _w(fmt=fmt)
  x = jax.random.normal(jax.random.key(0), (2, 3, 64))
  y = fp4jax.packed_matmul(x, w, out_dtype=jnp.float32)
  want = np.asarray(x, np.float64) @ np_dequantize_k_rows(w)
  assert y.shape == (2, 3, 24) and y.dtype == jnp.float32
  assert (np.abs(np.asarray(y) - want) <= _bound(np.asarray(x, np.float64), np_dequantize_k_rows(w))).all()


def test_quantized_activations_product_is_the_decoded_product():
  w = _w()
  xq = fp4jax.quantize(jax.random.normal(jax.random.key(0), (5, 64)) * 3, fp4jax.NVFP4, hadamard=None)
  y = np.asarray(fp4jax.packed_matmul(xq, w, out_dtype=jnp.float32, backend="xla"))
  xd = np_dequantize_k_rows(xq)
  assert (np.abs(y - xd @ np_dequantize_k_rows(w)) <= _bound(xd, np_dequantize_k_rows(w))).all()


# slow tier; default representative: test_public_variants.py's test_packed_matmul_matches_the_dequantized_product
# (W4A4 in the 16-point Hadamard domain against the NumPy oracle, jitted and eager)
@pytest.mark.slow
def test_hadamard_domain_product_equals_the_unrotated_product():
  """x and w rotated with the same 16-point signs: (x̂H)(ŵH)ᵀ = x̂ŵᵀ (H orthogonal), up to fp32 rounding."""
  w = _w(hadamard=16, hadamard_signs="te")
  xq = fp4jax.quantize(jax.random.normal(jax.random.key(0), (4, 64)), fp4jax.NVFP4, hadamard=16, hadamard_signs="te")
  y = np.asarray(fp4jax.packed_matmul(xq, w, out_dtype=jnp.float32), np.float64)
  xd, wd = (np.asarray(q.dequantize(jnp.float32), np.float64) for q in (xq, w))
  np.testing.assert_allclose(y, xd @ wd, rtol=0, atol=1e-5 * np.abs(xd @ wd).max())


def test_nan_scale_stays_nan():
  w = _w()
  w = dataclasses.replace(w, scales=w.scales.at[1, 3].set(jnp.nan))
  y = np.asarray(fp4jax.packed_matmul(jnp.ones((2, 64)), w, out_dtype=jnp.float32))
  assert np.isnan(y[:, 3]).all() and np.isfinite(np.delete(y, 3, axis=1)).all()


def test_gradient_wrt_x_is_g_times_the_decoded_weight_transposed():
  w = _w()
  x = jax.random.normal(jax.random.key(0), (3, 64))
  g = jax.grad(lambda x: jnp.sum(fp4jax.packed_matmul(x, w, out_dtype=jnp.float32) * jnp.arange(24.0)))(x)
  want = np.tile(np.arange(24.0), (3, 1)) @ np_dequantize_k_rows(w).T
  np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-6)


def test_differentiating_a_packed_operand_raises():
  w = _w()
  x = jnp.ones((3, 64))
  with pytest.raises(ValueError, match="inference only"):
    jax.grad(lambda w: jnp.sum(fp4jax.packed_matmul(x, w)), allow_int=True)(w)
  xq = fp4jax.quantize(x, fp4jax.NVFP4)
  with pytest.raises(ValueError, match="inference only"):
    jax.grad(lambda xq: jnp.sum(fp4jax.packed_matmul(xq, w)), allow_int=True)(xq)


def test_bad_operands_are_named():
  w = _w()
  with pytest.raises(ValueError, match="quantized along axis 0"):
    fp4jax.packed_matmul(jnp.ones((2, 24)), fp4jax.quantize(jnp.ones((64, 24)), fp4jax.NVFP4, hadamard=None))
  with pytest.raises(ValueError, match=r"last axis \(32"):
    fp4jax.packed_matmul(jnp.ones((2, 32)), w)
  with pytest.raises(TypeError, match="w must be a QTensor"):
    fp4jax.packed_matmul(jnp.ones((2, 64)), jnp.ones((64, 24)))
  with pytest.raises(TypeError, match="floating-point array"):
    fp4jax.packed_matmul(jnp.ones((2, 64), jnp.int32), w)
  with pytest.raises(ValueError, match="Hadamard domain"):
    fp4jax.packed_matmul(fp4jax.quantize(jnp.ones((2, 64)), fp4jax.NVFP4, hadamard=16, hadamard_signs="te"), w)
  wr = _w(hadamard=16, hadamard_signs="random", key=jax.random.key(3))
  xr = fp4jax.quantize(jnp.ones((2, 64)), fp4jax.NVFP4, hadamard=16, hadamard_signs="random", key=jax.random.key(4))
  with pytest.raises(ValueError, match="different Hadamard sign vectors"):
    fp4jax.packed_matmul(xr, wr)
  with pytest.raises(ValueError, match="backend must be one of"):
    fp4jax.packed_matmul(jnp.ones((2, 64)), w, backend="triton")


# ------------------------------------------------------------------------------------------------ Flax
class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(64, name="up")(x))
    x = nn.Dense(64, name="mid")(x)
    return nn.Dense(8, name="head")(x)


def _init(x):
  """The MLP's params: a ``QuantizedModule``'s are the module's own, the same tree and values (``qmodel.init`` would
  also run the quantized forward, eagerly: most of these tests' time)."""
  return MLP().init(jax.random.key(1), x)["params"]


# slow tier; default representative: [nvidia_nvfp4] (nvfp4_rtn's forward is nvidia_nvfp4's without the 2D tiles)
@pytest.mark.parametrize("recipe", [pytest.param("nvfp4_rtn", marks=pytest.mark.slow), "nvidia_nvfp4"])
def test_packed_apply_equals_the_quantized_model_on_unpacked_weights(recipe):
  """Packed inference vs the quantized model run on ``unpack(pack(params))`` (the head kept high precision): for
  NVFP4, re-quantizing an unpacked weight gives back its codes and scales, so both multiply the same FP4 operands,
  fp32 rounding apart (tolerance: 2^-16 of the output scale, far below one FP4 code step)."""
  qmodel = fq.quantize(MLP(), [fq.Rule("head", None), fq.Rule(".*", recipe)], defaults=())
  x = jax.random.normal(jax.random.key(0), (6, 64))
  params = _init(x)
  packed = fq.pack(params, qmodel)
  assert {k for k, v in packed.items() if isinstance(v["kernel"], fp4jax.QTensor)} == {"up", "mid"}
  y = fq.packed.apply(qmodel, {"params": packed}, x)
  want = dataclasses.replace(qmodel, deterministic=True).apply({"params": fq.unpack(packed)}, x)
  high = MLP().apply({"params": params}, x)  # the unquantized model differs by FP4 error (>> tolerance)
  scale = float(jnp.abs(want).max())
  np.testing.assert_allclose(np.asarray(y), np.asarray(want), rtol=0, atol=2.0**-16 * scale)
  assert float(jnp.abs(high - want).max()) > 2.0**-8 * scale


def test_packed_apply_of_quartet_multiplies_the_packed_operands_in_the_hadamard_domain():
  """MXFP4 with QuEST scales and a 32-point Hadamard (re-quantizing an unpacked weight does not give its scales
  back, so the oracle is the layer by layer product of NumPy decodes: activations quantized as the recipe's
  forward quantizes them, both operands' rotated-domain values, whose product is the unrotated one)."""
  qmodel = fq.quantize(MLP(), [fq.Rule("head", None), fq.Rule(".*", "quartet")], defaults=())
  x = jax.random.normal(jax.random.key(0), (6, 64))
  params = _init(x)
  packed = fq.pack(params, qmodel)
  with jax.default_matmul_precision("highest"):  # fp32 GEMMs, not TF32, on a GPU
    y = fq.packed.apply(qmodel, {"params": packed}, x)
  act = {"fmt": fp4jax.recipes.get("quartet").fwd_lhs.fmt, "hadamard": 32, "hadamard_signs": "none"}
  h = x
  for name in ("up", "mid"):
    hq = fp4jax.quantize(jnp.asarray(h, jnp.float32), **act)
    h = np_dequantize_k_rows(hq) @ np_dequantize_k_rows(packed[name]["kernel"]) + np.asarray(params[name]["bias"])
    h = np.maximum(h, 0) if name == "up" else h
  want = h @ np.asarray(params["head"]["kernel"], np.float64) + np.asarray(params["head"]["bias"])
  np.testing.assert_allclose(np.asarray(y), want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.filterwarnings("ignore:fp4jax.flax rules")
def test_packed_apply_runs_a_high_precision_packed_layer_weight_only():
  """A layer packed with select= but planned high precision: ``x @ dequantize(kernel)``."""
  qmodel = fq.quantize(MLP(), [fq.Rule(".*", None)], defaults=())
  x = jax.random.normal(jax.random.key(0), (3, 64))
  params = qmodel.init(jax.random.key(1), x)["params"]
  packed = fq.pack(params, select="head/kernel")
  y = fq.packed.apply(qmodel, {"params": packed}, x)
  h = nn.relu(x @ params["up"]["kernel"] + params["up"]["bias"]) @ params["mid"]["kernel"] + params["mid"]["bias"]
  want = np.asarray(h, np.float64) @ np_dequantize_k_rows(packed["head"]["kernel"]) + np.asarray(params["head"]["bias"])
  np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)


def test_packed_apply_refuses_what_it_cannot_run():
  with pytest.raises(TypeError, match="QuantizedModule"):
    fq.packed.apply(MLP(), {"params": {}}, jnp.ones((1, 64)))
  qmodel = fq.quantize(MLP(), [fq.Rule(".*", "ms_fp4")], defaults=())
  x = jnp.ones((2, 64))
  params = _init(x)
  packed = fq.pack(params, select="up/kernel")
  with pytest.raises(ValueError, match="block-scaled FP4 activations"):
    fq.packed.apply(qmodel, {"params": packed}, x)


# ------------------------------------------------------------------------------------------------ Flax NNX
class NnxMLP(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.up, self.mid = nnx.Linear(64, 64, rngs=rngs), nnx.Linear(64, 64, rngs=rngs)
    self.head = nnx.Linear(64, 8, rngs=rngs)

  def __call__(self, x):
    return self.head(self.mid(nnx.relu(self.up(x))))


def _nnx_mlp(rules, seed: int, **kwargs):
  return fq.quantize(NnxMLP(nnx.Rngs(seed)), rules, defaults=(), **kwargs)


def _params(model):
  return nnx.state(model, nnx.Param).to_pure_dict()


def _with_params(model, params):
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  nnx.update(model, state)
  return model


# slow tier; default representative: [nvidia_nvfp4] (nvfp4_rtn's forward is nvidia_nvfp4's without the 2D tiles)
@pytest.mark.parametrize("recipe", [pytest.param("nvfp4_rtn", marks=pytest.mark.slow), "nvidia_nvfp4"])
def test_packed_nnx_equals_the_quantized_model_on_unpacked_weights(recipe):
  """As the linen test: for NVFP4, re-quantizing an unpacked weight gives back its codes and scales, so both
  multiply the same FP4 operands and differ by fp32 rounding only (accumulation order, a last-bit tensor scale):
  per layer at most (K+2)·u·Σ|a||b| ≈ 2^-18·Σ|a||b| for K = 64, with Σ|a||b| a few times the output scale here, so
  2^-16 of the output scale bounds it, far below one FP4 code step (the unquantized model's difference). The packed
  params run on a model initialized from another seed: a layer not replaced would multiply that model's kernel."""
  rules = [fq.Rule("head", None), fq.Rule(".*", recipe)]
  model = _nnx_mlp(rules, 1, rngs=nnx.Rngs(quant=0))
  x = jax.random.normal(jax.random.key(0), (2, 3, 64))
  params = _params(model)
  packed = fq.pack(params, model)
  assert {k for k, v in packed.items() if isinstance(v["kernel"], fp4jax.QTensor)} == {"up", "mid"}
  other = _nnx_mlp(rules, 2, rngs=nnx.Rngs(quant=0))
  y = fq.packed.apply_nnx(other, packed, x)
  want = _with_params(_nnx_mlp(rules, 3, deterministic=True), fq.unpack(packed))(x)
  high = _with_params(NnxMLP(nnx.Rngs(4)), params)(x)
  scale = float(jnp.abs(want).max())
  np.testing.assert_allclose(np.asarray(y), np.asarray(want), rtol=0, atol=2.0**-16 * scale)
  assert float(jnp.abs(high - want).max()) > 2.0**-8 * scale
  # the model passed in is not changed: its own layers, kernels and (training-mode) ops
  assert type(other.up) is nnx.Linear and not other.up.dot_general.deterministic
  fresh = _params(_nnx_mlp(rules, 2, rngs=nnx.Rngs(quant=0)))
  np.testing.assert_array_equal(other.up.kernel[...], fresh["up"]["kernel"])
  np.testing.assert_array_equal(jax.jit(lambda p, x: fq.packed.apply_nnx(other, p, x))(packed, x), y)


def test_packed_nnx_of_quartet_multiplies_the_packed_operands_in_the_hadamard_domain():
  """As the linen test: layer by layer NumPy decodes of the recipe's quantized activations and the packed weights
  (both rotated by the same 32-point Hadamard, so their product is the unrotated one)."""
  model = _nnx_mlp([fq.Rule("head", None), fq.Rule(".*", "quartet")], 1, rngs=nnx.Rngs(quant=0))
  x = jax.random.normal(jax.random.key(0), (6, 64))
  params = _params(model)
  packed = fq.pack(params, model)
  with jax.default_matmul_precision("highest"):
    y = fq.packed.apply_nnx(model, packed, x)
  act = {"fmt": fp4jax.recipes.get("quartet").fwd_lhs.fmt, "hadamard": 32, "hadamard_signs": "none"}
  h = x
  for name in ("up", "mid"):
    hq = fp4jax.quantize(jnp.asarray(h, jnp.float32), **act)
    h = np_dequantize_k_rows(hq) @ np_dequantize_k_rows(packed[name]["kernel"]) + np.asarray(params[name]["bias"])
    h = np.maximum(h, 0) if name == "up" else h
  want = h @ np.asarray(params["head"]["kernel"], np.float64) + np.asarray(params["head"]["bias"])
  np.testing.assert_allclose(np.asarray(y), want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.filterwarnings("ignore:fp4jax.flax rules")
def test_packed_nnx_runs_a_high_precision_packed_layer_weight_only():
  """A layer packed with select= but planned high precision: ``x @ dequantize(kernel)``, activations unquantized."""
  model = _nnx_mlp([fq.Rule(".*", None)], 1)
  x = jax.random.normal(jax.random.key(0), (3, 64))
  params = _params(model)
  packed = fq.pack(params, select="head/kernel")
  y = fq.packed.apply_nnx(model, packed, x)
  h = nn.relu(x @ params["up"]["kernel"] + params["up"]["bias"]) @ params["mid"]["kernel"] + params["mid"]["bias"]
  want = np.asarray(h, np.float64) @ np_dequantize_k_rows(packed["head"]["kernel"]) + np.asarray(params["head"]["bias"])
  np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)


class _NnxEinsumHead(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.up = nnx.Linear(64, 64, rngs=rngs)
    self.head = nnx.Einsum("bd,df->bf", (64, 8), rngs=rngs)

  def __call__(self, x):
    return self.head(self.up(x))


def test_packed_nnx_refuses_what_it_cannot_run():
  x = jnp.ones((2, 64))
  with pytest.raises(TypeError, match="flax.nnx Module"):
    fq.packed.apply_nnx(MLP(), {}, x)
  with pytest.raises(ValueError, match="backend must be one of"):
    fq.packed.apply_nnx(_nnx_mlp([fq.Rule(".*", "nvfp4_rtn")], 1), {}, x, backend="triton")
  model = _nnx_mlp([fq.Rule(".*", "ms_fp4")], 1)
  packed = fq.pack(_params(model), select="up/kernel")
  with pytest.raises(ValueError, match="at 'up'.*block-scaled FP4 activations"):
    fq.packed.apply_nnx(model, packed, x)
  model = _nnx_mlp([fq.Rule(".*", "nvfp4_rtn")], 1)
  packed = fq.pack(_params(model), model)
  with pytest.raises(ValueError, match=r"layer 'up' has shape \(64, 8\), the layer's kernel \(64, 64\)"):
    fq.packed.apply_nnx(model, {**packed, "up": packed["head"]}, x)
  with pytest.raises(ValueError, match="'up/bias' is a QTensor but not the kernel"):
    fq.packed.apply_nnx(model, {"up": {"bias": packed["up"]["kernel"]}}, x)
  with pytest.raises(ValueError, match="no param for"):
    fq.packed.apply_nnx(model, {"nope": {"kernel": jnp.ones((64, 64))}}, x)
  einsum = fq.quantize(_NnxEinsumHead(nnx.Rngs(0)), [fq.Rule(".*", "nvfp4_rtn")], defaults=())
  with pytest.raises(ValueError, match=r"layer 'head' \(Einsum\) has a packed kernel"):
    fq.packed.apply_nnx(einsum, fq.pack(_params(einsum), select="head/kernel"), x)
