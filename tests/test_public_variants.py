"""Every public function that computes on arrays, jitted and eager (``chex.variants``), against independent oracles.

Each test runs once under ``jax.jit`` and once eagerly (the eager path once crashed under x64). Both variants are
compared with a NumPy oracle: bit for bit for the quantizers (``tests/numpy_reference.py``: TE-order NVFP4, OCP
MXFP4 with the library's random bits), to float32 accumulation error for the GEMMs (``tests/oracles.py``: the layer
oracle in float64 for deterministic recipes on dyadic inputs). Each variant is also compared bit for bit with the
jitted function's result (``_jitted``), so the eager variant must give the jitted bits exactly, except
``packed_matmul``: its eager and jitted fp32 dots sum the same exact products in different orders (the contract in
``fp4jax._src.matmul``), so there both variants are held to the oracle's accumulation bound only.
"""

from __future__ import annotations

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fp4jax
import fp4jax.flax
from fp4jax._src import recipes
from tests import numpy_reference as ref
from tests import oracles

DN = (((1,), (1,)), ((), ()))
M, K, N = 32, 64, 32
KEY = jax.random.key(3)
# One recipe per element format (FP8, NVFP4, MXFP4, per-channel E2M1), deterministic (RTN, the run's fixed Hadamard
# signs) so that the layer oracle computes it. quartet2 (NVFP4, Hadamard-128 along M and N) needs M, N >= 128 and
# nvfp4_rtn is nvidia_nvfp4 without its extras: both run jitted against the oracle in tests/test_oracles_dot.py.
RECIPES = ("fp8", "nvidia_nvfp4", "quartet", "ms_fp4")


def _bits(a) -> np.ndarray:
  a = np.asarray(a)
  return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def _assert_same_bits(got, want, what: str) -> None:
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(_bits(g), _bits(w), err_msg=what)


@functools.cache
def _jitted(case: str):
  """The jitted result of ``CASES[case]`` (computed once; the variants compare their bits with it)."""
  fn, args = CASES[case]()
  return jax.jit(fn)(*args)


def _layer_oracle(recipe: recipes.Recipe, x, w, dy):
  d_fwd, d_bwd = recipe.fwd_lhs.hadamard, recipe.dgrad_lhs.hadamard
  fwd_signs = oracles.fixed_signs(d_fwd) if d_fwd and recipe.fwd_lhs.signs == "fixed" else None
  bwd_signs = oracles.fixed_signs(d_bwd) if d_bwd and recipe.dgrad_lhs.signs == "fixed" else None
  return oracles.layer_grads(recipe, x, w, dy, fwd_signs, bwd_signs)


def _operands():
  return oracles.dyadic(1, (M, K), 6.0), oracles.dyadic(2, (N, K), -6.0), oracles.dyadic(3, (M, N), 6.0)


def _t_data(shape, seed=0):
  return np.random.RandomState(seed).standard_t(3, shape).astype(np.float32)


# ------------------------------------------------------------------------------------------------ the cases
def _dot_case(name: str):
  recipe = recipes.deterministic(name)

  def fn(x, w, dy):
    y, vjp = jax.vjp(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=recipe), x, w)
    return (y, *vjp(dy))

  return fn, _operands()


def _einsum_case():
  recipe = recipes.deterministic("nvidia_nvfp4")
  x, w, _ = _operands()
  return (lambda a, b: fp4jax.einsum("mk,nk->mn", a, b, recipe=recipe)), (x, w)


def _packed_case(hadamard: int):
  """W4A16 (``hadamard=0``: t-distributed data) or W4A4 in the Hadamard-16 domain (TE signs; dyadic data, so the
  rotation is exact in float32 and the oracle rotates alike)."""
  if not hadamard:
    return fp4jax.packed_matmul, (_t_data((8, 64), 1), fp4jax.quantize(_t_data((64, 24), 2), fp4jax.NVFP4, axis=0))
  x, w = oracles.dyadic(4, (8, 64), 4.0), oracles.dyadic(5, (64, 24), -4.0)
  wq = fp4jax.quantize(w, fp4jax.NVFP4, axis=0, hadamard=16, hadamard_signs="te")
  rotated = lambda a, b: fp4jax.packed_matmul(fp4jax.quantize(a, fp4jax.NVFP4, hadamard=16, hadamard_signs="te"), b)
  return rotated, (x, wq)


def _linen_params(x):
  _, w, _ = _operands()
  return {"params": {"kernel": jnp.asarray(w.T)}}, x


def _linen_case(kind: str):
  x, _, _ = _operands()
  layer = {
    "Dense": fp4jax.flax.linen.Dense(N, use_bias=False, recipe="nvidia_nvfp4", deterministic=True),
    "DenseGeneral": fp4jax.flax.linen.DenseGeneral(N, use_bias=False, recipe="nvidia_nvfp4", deterministic=True),
    "Einsum": fp4jax.flax.linen.Einsum((K, N), "mk,kn->mn", use_bias=False, recipe="nvidia_nvfp4", deterministic=True),
  }[kind]
  return layer.apply, _linen_params(x)


def _quantized_model_case():
  """``fp4jax.flax.quantize`` of a plain ``nn.Dense`` (rules: everything runs nvidia_nvfp4), applied."""
  x, _, _ = _operands()
  model = fp4jax.flax.quantize(
    nn.Dense(N, use_bias=False), [fp4jax.flax.Rule(".*", "nvidia_nvfp4")], defaults=(), deterministic=True
  )
  return model.apply, _linen_params(x)


def _nnx_case(kind: str):
  x, w, _ = _operands()
  kw = dict(recipe="nvidia_nvfp4", deterministic=True, rngs=nnx.Rngs(0))
  if kind == "Linear":
    layer = fp4jax.flax.nnx.Linear(K, N, use_bias=False, **kw)
  else:
    layer = fp4jax.flax.nnx.Einsum("mk,kn->mn", (K, N), **kw)
  layer.kernel[...] = jnp.asarray(w.T)
  graph, state = nnx.split(layer)
  return (lambda s, a: nnx.merge(graph, s)(a)), (state, x)


CASES = {
  **{f"dot_{name}": functools.partial(_dot_case, name) for name in RECIPES},
  "einsum": _einsum_case,
  "packed": functools.partial(_packed_case, 0),
  "packed_w4a4": functools.partial(_packed_case, 16),
  **{f"linen_{kind}": functools.partial(_linen_case, kind) for kind in ("Dense", "DenseGeneral", "Einsum")},
  "linen_quantized_model": _quantized_model_case,
  **{f"nnx_{kind}": functools.partial(_nnx_case, kind) for kind in ("Linear", "Einsum")},
}


class PublicVariantsTest(chex.TestCase):
  def _run(self, case: str, same_bits: bool = True):
    """The variant's result of ``CASES[case]``, checked bit for bit against the jitted result if ``same_bits``."""
    fn, args = CASES[case]()
    got = self.variant(fn)(*args)
    if same_bits:
      _assert_same_bits(got, _jitted(case), f"{case}: {self.variant.type} vs jit")
    return got

  # -------------------------------------------------------------------------------------------- quantizers
  @chex.variants(with_jit=True, without_jit=True)
  def test_quantize_fake_quantize_and_dequantize_nvfp4_match_te_reference(self):
    x = _t_data((8, 64))
    codes, dec, s_dec, deq = ref.nvfp4_reference(x)
    q = self.variant(lambda a: fp4jax.quantize(a, fp4jax.NVFP4))(x)
    np.testing.assert_array_equal(np.asarray(q.unpacked_codes()), codes)
    _assert_same_bits(q.scale_values(), dec, "block scales")
    _assert_same_bits(q.global_scale, s_dec, "tensor scale")
    _assert_same_bits(self.variant(lambda t: t.dequantize(jnp.float32))(q), deq, "QTensor.dequantize")
    _assert_same_bits(self.variant(lambda a: fp4jax.fake_quantize(a, fp4jax.NVFP4))(x), deq, "fake_quantize")

  @chex.variants(with_jit=True, without_jit=True)
  def test_quantize_and_fake_quantize_mxfp4_sr_match_ocp_reference(self):
    x = _t_data((8, 64), 4)
    bits = np.asarray(fp4jax.bits.random_bits(jax.random.split(KEY, 3)[1], x.shape))
    codes, exps, deq = ref.mxfp4_reference(x, fp4jax.MXFP4.scale_mode, "sr", bits)
    q = self.variant(lambda a, k: fp4jax.quantize(a, fp4jax.MXFP4, rounding="sr", key=k))(x, KEY)
    np.testing.assert_array_equal(np.asarray(q.unpacked_codes()), codes)
    np.testing.assert_array_equal(np.asarray(q.scales).view(np.uint8).astype(np.int64) - 127, exps)
    _assert_same_bits(q.dequantize(jnp.float32), deq, "QTensor.dequantize")
    fq = self.variant(lambda a, k: fp4jax.fake_quantize(a, fp4jax.MXFP4, rounding="sr", key=k))(x, KEY)
    _assert_same_bits(fq, deq, "fake_quantize")

  # -------------------------------------------------------------------------------------------- GEMMs
  def _check_dots(self, names):
    x, w, dy = _operands()
    for name in names:
      got = self._run(f"dot_{name}")
      for g, t, what in zip(got, _layer_oracle(recipes.deterministic(name), x, w, dy), ("y", "dx", "dw")):
        oracles.assert_close(g, t, f"{name}: {what}")

  @chex.variants(with_jit=True)
  def test_dot_general_forward_and_gradients_match_the_layer_oracle(self):
    """Jitted, nvidia_nvfp4 (the eager test's recipe: 2D weight tiles, the 16-point Hadamard) in the default tier;
    every recipe in the slow test below."""
    self._check_dots(("nvidia_nvfp4",))

  @chex.variants(with_jit=True)
  # slow tier; default representative: test_dot_general_forward_and_gradients_match_the_layer_oracle (nvidia_nvfp4)
  # and tests/test_oracles_dot.py (each recipe's jitted forward and gradients against the NumPy oracle)
  @pytest.mark.slow
  def test_dot_general_of_every_recipe_matches_the_layer_oracle(self):
    self._check_dots(RECIPES)

  @chex.variants(without_jit=True)
  # slow tier; default representative: test_eager_quantize_and_dot_general_under_x64_give_the_x32_bits (the eager
  # forward dot, the same bits as jitted) and the jitted dot's forward and gradients against the layer oracle
  @pytest.mark.slow
  def test_eager_dot_general_matches_the_layer_oracle(self):
    """Eagerly, nvidia_nvfp4 (SR, the random Hadamard, 2D weight tiles) in the default tier; every recipe in the
    slow test below."""
    self._check_dots(("nvidia_nvfp4",))

  @chex.variants(without_jit=True)
  # slow tier; default representative: test_eager_quantize_and_dot_general_under_x64_give_the_x32_bits (eagerly)
  @pytest.mark.slow
  def test_eager_dot_general_of_every_recipe_matches_the_layer_oracle(self):
    self._check_dots(RECIPES)

  @chex.variants(with_jit=True, without_jit=True)
  def test_einsum_matches_the_layer_oracle(self):
    x, w, dy = _operands()
    oracles.assert_close(
      self._run("einsum"), _layer_oracle(recipes.deterministic("nvidia_nvfp4"), x, w, dy)[0], "einsum"
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_packed_matmul_matches_the_dequantized_product(self):
    """x @ dq(w) (W4A16) and dq(x)·dq(w) in the rotated domain (W4A4), each dequantized by the NumPy NVFP4 oracle
    (along K: the weight transposed) and multiplied in float64."""
    (x, _), (xh, _) = _packed_case(0)[1], _packed_case(16)[1]
    w = _t_data((64, 24), 2)
    oracles.assert_close(
      self._run("packed", same_bits=False), x.astype(np.float64) @ ref.nvfp4_reference(w.T)[3].T, "W4A16"
    )
    wh = oracles.dyadic(5, (64, 24), -4.0)
    rot = lambda a: oracles.rotate_last(a, 16, oracles.TE_SIGNS_16)
    a, b = ref.nvfp4_reference(rot(xh))[3], ref.nvfp4_reference(rot(wh.T))[3]
    oracles.assert_close(
      self._run("packed_w4a4", same_bits=False), a.astype(np.float64) @ b.T.astype(np.float64), "W4A4"
    )

  # -------------------------------------------------------------------------------------------- Flax layers
  def _check_flax(self, cases):
    x, w, dy = _operands()
    want = _layer_oracle(recipes.deterministic("nvidia_nvfp4"), x, w, dy)[0]
    for case in cases:
      oracles.assert_close(self._run(case), want, case)

  @chex.variants(with_jit=True, without_jit=True)
  def test_flax_layers_apply_matches_the_layer_oracle(self):
    """linen's Dense, a model quantized by rules and NNX's Linear in the default tier; every layer in the slow test
    below."""
    self._check_flax(("linen_Dense", "linen_quantized_model", "nnx_Linear"))

  @chex.variants(with_jit=True, without_jit=True)
  # slow tier; default representative: test_flax_layers_apply_matches_the_layer_oracle (one layer of each API)
  @pytest.mark.slow
  def test_every_flax_layer_applies_as_the_layer_oracle(self):
    self._check_flax([c for c in CASES if c.startswith(("linen_", "nnx_"))])

  # -------------------------------------------------------------------------------------------- x64
  def test_eager_quantize_and_dot_general_under_x64_give_the_x32_bits(self):
    """The eager path under ``jax_enable_x64`` (it once segfaulted XLA:CPU: int32 | int64 bit operations) in this
    process: the same bits as jitted without x64. The forward only; tests/test_x64.py runs the gradients."""
    x, w, _ = _operands()
    recipe = recipes.deterministic("nvidia_nvfp4")
    fq = lambda a: fp4jax.fake_quantize(a, fp4jax.NVFP4, rounding="sr", key=KEY)
    dot = lambda a, b: fp4jax.dot_general(a, b, DN, recipe=recipe)
    want_q, want_dot = jax.jit(fq)(x), jax.jit(dot)(x, w)
    with jax.enable_x64(True):
      got_q, got_dot = fq(x), dot(x, w)
    _assert_same_bits(got_q, want_q, "fake_quantize under x64")
    _assert_same_bits(got_dot, want_dot, "dot_general under x64")
