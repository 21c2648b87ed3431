"""fp4jax.prequantize_weight: W quantized ahead of the dots that read it, the bits each dot would draw."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax._src import recipes
from tests import numpy_reference as ref

KEY = jax.random.key(0)
DENSE = (((1,), (0,)), ((), ()))  # flax nn.Dense: x (tokens, in) . kernel (in, out)
ACCEPTED = [n for n in recipes.names() if fp4jax.prequantize_refusal(n) is None]


def _stack(layers: int, k: int, n: int) -> jax.Array:
  return (jax.random.normal(jax.random.key(1), (layers, k, n)) / np.sqrt(k)).astype(jnp.bfloat16)


def _value_and_grads(recipe, x, kernel, pre):
  """Jitted loss and gradients of x and kernel; ``pre`` is an argument, as in a model. (Closed over, it is a
  constant XLA folds the dot's arithmetic on: on the CPU ms_fp4's dX, which re-quantizes the forward W to FP8, then
  differed from the traced program's.)"""

  def loss(x, kernel, pre):
    y = fp4jax.dot_general(x, kernel, DENSE, recipe=recipe, key=KEY, rhs_prequantized=pre)
    return jnp.sum(jnp.square(y.astype(jnp.float32)))

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, kernel, pre)


def test_every_published_recipe_that_quantizes_w_is_accepted():
  assert set(ACCEPTED) == set(recipes.PUBLISHED) - {"bf16"}


# W once, its 2D tiles reused by dgrad; W and Wᵀ each from the input; W rotated, with QuEST's trust mask; DGE's
# backward reading W itself
DEFAULT_TIER = ("nvidia_nvfp4", "nvfp4_rtn", "quartet", "ms_fp4")


@pytest.mark.parametrize(  # slow tier; default representatives: DEFAULT_TIER
  "name", [n if n in DEFAULT_TIER else pytest.param(n, marks=pytest.mark.slow) for n in ACCEPTED]
)
def test_a_stack_prequantized_under_vmap_gives_each_layer_the_dots_own_bits(name):
  """Each layer's slice of the vmapped prequantization: the same forward value and the same gradients of x and W,
  bit for bit, as the dot quantizing that W itself (with the same key: the recipe's random operands are
  unchanged)."""
  # Quartet II's backward RHT-128; quartet: K = 80 is zero-padded to three 32-point Hadamard chunks
  m, k, n = {"quartet2": (128, 128, 128), "quartet": (64, 80, 64)}.get(name, (32, 64, 48))
  kernels = _stack(3, k, n)
  x = jax.random.normal(jax.random.key(2), (m, k)).astype(jnp.bfloat16)
  stacked = jax.jit(jax.vmap(lambda w: fp4jax.prequantize_weight(w, DENSE, recipe=name)))(kernels)
  padded = k + -k % (recipes.get(name).fwd_rhs.hadamard or 1)
  assert stacked.fwd.values.shape == (3, 1, n, padded)  # W as (batch, out, in), one per layer
  for layer in (0, 2):
    pre = jax.tree.map(lambda a: a[layer], stacked)
    own = _value_and_grads(name, x, kernels[layer], None)
    given = _value_and_grads(name, x, kernels[layer], pre)
    for a, b in zip(jax.tree.leaves(own), jax.tree.leaves(given)):
      np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_nvfp4_rtn_prequantizes_w_along_k_and_wt_along_n_as_the_numpy_reference():
  """The oracle: TE-order NVFP4 1x16 (tests/numpy_reference.py) of W (out, in) for the forward and of Wᵀ (in, out)
  for the data-gradient GEMM, each with its own tensor scale."""
  kernel = _stack(1, 64, 48)[0]  # (in, out)
  pre = fp4jax.prequantize_weight(kernel, DENSE, recipe="nvfp4_rtn")
  w = np.asarray(kernel, np.float32).T  # (out, in)
  np.testing.assert_array_equal(np.asarray(pre.fwd.dequantize())[0], ref.nvfp4_reference(w)[3])
  np.testing.assert_array_equal(np.asarray(pre.dgrad.dequantize())[0], ref.nvfp4_reference(w.T)[3])  # (in, out)


def test_nvidia_prequantizes_w_once_its_dgrad_reuses_the_forward_tiles():
  pre = fp4jax.prequantize_weight(_stack(1, 64, 48)[0], DENSE, recipe="nvidia_nvfp4")
  assert pre.dgrad is None and pre.recipe == "nvidia_nvfp4"


def test_the_prequantized_w_is_not_differentiated():
  kernel = _stack(1, 32, 32)[0]
  grad = jax.grad(lambda w: jnp.sum(fp4jax.prequantize_weight(w, DENSE, recipe="nvfp4_rtn").fwd.dequantize()))(kernel)
  np.testing.assert_array_equal(grad, np.zeros(kernel.shape))


@pytest.mark.parametrize(
  "recipe, why",
  [
    ("bf16", "does not quantize W"),
    (
      dataclasses.replace(
        recipes.get("nvidia_nvfp4"), name="w_sr", fwd_rhs=recipes.OperandSpec(fmt=fp4jax.NVFP4, rounding="sr")
      ),
      "fwd_rhs quantizes W with rounding='sr'",
    ),
    (
      dataclasses.replace(
        recipes.get("nvfp4_rtn"),
        name="w_random_signs",
        fwd_lhs=recipes.OperandSpec(fmt=fp4jax.NVFP4, hadamard=16, signs="random"),
        fwd_rhs=recipes.OperandSpec(fmt=fp4jax.NVFP4, hadamard=16, signs="random"),
      ),
      "fwd_rhs quantizes W with signs='random'",
    ),
    (fp4jax.sharding.sharded("nvidia_nvfp4", "model", "outputs"), "sharded recipe"),
  ],
)
def test_a_recipe_whose_w_needs_a_key_or_more_than_its_bits_is_refused_with_the_reason(recipe, why):
  assert why in fp4jax.prequantize_refusal(recipe)
  with pytest.raises(ValueError, match=f"fp4jax.prequantize_weight.*W cannot be quantized ahead.*{re.escape(why)}"):
    fp4jax.prequantize_weight(jnp.ones((32, 32)), DENSE, recipe=recipe)


def test_a_prequantized_w_of_another_shape_recipe_dtype_or_type_is_refused():
  kernels = _stack(2, 32, 32)
  x = jnp.ones((16, 32), jnp.bfloat16)
  stacked = jax.vmap(lambda w: fp4jax.prequantize_weight(w, DENSE, recipe="nvidia_nvfp4"))(kernels)
  with pytest.raises(ValueError, match=r"rhs_prequantized holds W as \(batch, out, in\) = \(2, 1, 32, 32\)"):
    fp4jax.dot_general(x, kernels[0], DENSE, recipe="nvidia_nvfp4", key=KEY, rhs_prequantized=stacked)
  rtn = fp4jax.prequantize_weight(kernels[0], DENSE, recipe="nvfp4_rtn")
  with pytest.raises(ValueError, match="quantized for recipe 'nvfp4_rtn'"):
    fp4jax.dot_general(x, kernels[0], DENSE, recipe="nvidia_nvfp4", key=KEY, rhs_prequantized=rtn)
  with pytest.raises(ValueError, match="quantized from a bfloat16 rhs, this dot's rhs is float32"):
    fp4jax.dot_general(x, kernels[0].astype(jnp.float32), DENSE, recipe="nvfp4_rtn", key=KEY, rhs_prequantized=rtn)
  with pytest.raises(TypeError, match="rhs_prequantized must be a PrequantizedWeight"):
    fp4jax.dot_general(x, kernels[0], DENSE, recipe="nvidia_nvfp4", key=KEY, rhs_prequantized=rtn.fwd)


@pytest.mark.parametrize("name", ["nvidia_nvfp4", "nvfp4_rtn", "quartet2"])
def test_the_kernels_prequantize_a_stack_under_vmap_with_xlas_bits(name):
  """``backend="pallas"`` (Pallas interpret mode off a GPU): the quantize kernel batched by ``jax.vmap`` over the
  layers, the bits of XLA's quantizers (16x16 tiles for nvidia_nvfp4; W and Wᵀ 1x16 for nvfp4_rtn; quartet2's
  4/6 block targets): what ``"auto"`` runs on a GPU at any size."""
  pytest.importorskip("fp4jax_kernels")
  kernels = _stack(2, 128, 64)
  by = {
    backend: jax.jit(jax.vmap(lambda w, b=backend: fp4jax.prequantize_weight(w, DENSE, recipe=name, backend=b)))(
      kernels
    )
    for backend in ("xla", "pallas")
  }
  for a, b in zip(jax.tree.leaves(by["xla"]), jax.tree.leaves(by["pallas"])):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


@pytest.mark.parametrize("signs", ["te", pytest.param("fixed", marks=pytest.mark.slow)])  # slow tier: default [te]
def test_a_w_rotated_with_signs_that_are_not_drawn_is_prequantized_with_them(signs):
  """A forward Hadamard with TE's or the fixed sign vector: W prequantized with the signs its dot applies."""
  rotated = recipes.OperandSpec(fmt=fp4jax.NVFP4, hadamard=16, signs=signs)
  recipe = dataclasses.replace(recipes.get("nvfp4_rtn"), name=f"w_rht_{signs}", fwd_lhs=rotated, fwd_rhs=rotated)
  kernel = _stack(1, 64, 48)[0]
  x = jax.random.normal(jax.random.key(2), (32, 64)).astype(jnp.bfloat16)
  pre = fp4jax.prequantize_weight(kernel, DENSE, recipe=recipe)
  own, given = (_value_and_grads(recipe, x, kernel, p) for p in (None, pre))
  for a, b in zip(jax.tree.leaves(own), jax.tree.leaves(given)):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_bad_rhs_or_dimension_numbers_are_refused_naming_the_argument():
  with pytest.raises(ValueError, match=r"fp4jax.prequantize_weight: rhs of shape \(0, 32\) is empty"):
    fp4jax.prequantize_weight(jnp.ones((0, 32)), DENSE, recipe="nvidia_nvfp4")
  with pytest.raises(TypeError, match="fp4jax.prequantize_weight.*rhs"):
    fp4jax.prequantize_weight(jnp.ones((32, 32), jnp.int32), DENSE, recipe="nvidia_nvfp4")
  with pytest.raises(ValueError, match="dimension_numbers must be"):
    fp4jax.prequantize_weight(jnp.ones((32, 32)), (0,), recipe="nvidia_nvfp4")
  with pytest.raises(ValueError, match="rhs dimension 2 out of range"):
    fp4jax.prequantize_weight(jnp.ones((32, 32)), (((1,), (2,)), ((), ())), recipe="nvidia_nvfp4")
