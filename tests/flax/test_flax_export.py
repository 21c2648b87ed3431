"""Packed export: weights as QTensors equal the recipe's forward weights; orbax round trip is bit-identical."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax_models as fm
import fp4jax
from fp4jax.flax import export


def _params():
  toks = fm.tokens(jax.random.key(0))[:, :-1]
  return fm.LinenTransformer(fm.Config()).init(jax.random.key(1), toks)["params"]


def _qtensors(tree):
  flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, fp4jax.QTensor))[0]
  return {jax.tree_util.keystr(k): v for k, v in flat}


@pytest.mark.parametrize("recipe", ["nvidia_nvfp4", "quartet"])
def test_pack_is_the_recipes_forward_weight_and_orbax_round_trip_is_bit_identical(recipe, tmp_path):
  params = _params()
  packed = export.pack(params, recipe=recipe)
  spec = fp4jax.recipes.get(recipe).fwd_rhs
  kernel = params["block_0"]["qkv"]["kernel"]
  q = packed["block_0"]["qkv"]["kernel"]
  assert isinstance(q, fp4jax.QTensor) and q.codes.dtype == jnp.uint8 and q.fmt == spec.fmt
  fq = lambda w: fp4jax.fake_quantize(w, spec.fmt, axis=0, block_shape=spec.block_shape,
                                      hadamard=spec.hadamard or None, hadamard_signs="none")
  want = jax.jit(fq)(kernel)
  np.testing.assert_array_equal(export.unpack(packed)["block_0"]["qkv"]["kernel"], want)
  assert not isinstance(packed["embed"]["embedding"], fp4jax.QTensor)  # only "kernel" leaves by default

  export.save(tmp_path / "ckpt", packed)
  restored = export.restore(tmp_path / "ckpt")
  got, ref = _qtensors(restored), _qtensors(packed)
  assert got.keys() == ref.keys()
  for k, a in ref.items():
    b = got[k]
    if isinstance(a, fp4jax.QTensor):
      assert (a.shape, a.axis, a.fmt, a.block_shape, a.hadamard, a.dtype) == (
          b.shape, b.axis, b.fmt, b.block_shape, b.hadamard, b.dtype)
      for field in ("codes", "scales", "global_scale"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and x.shape == y.shape, (k, field)
        np.testing.assert_array_equal(jax.lax.bitcast_convert_type(x, jnp.uint8), jax.lax.bitcast_convert_type(y, jnp.uint8))
    else:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bytes_saved_by_packing():
  params = _params()
  packed = export.pack(params, recipe="nvidia_nvfp4")
  n_kernel = sum(q.codes.size * 2 for q in _qtensors(packed).values() if isinstance(q, fp4jax.QTensor))
  n_qt = sum(isinstance(q, fp4jax.QTensor) for q in _qtensors(packed).values())
  report = export.bytes_report(params, packed)
  # fp32 kernels, 4 bytes per element, become 1/2 byte (E2M1 code) + 1/256 (one E4M3 scale per 16x16 tile)
  # + 4 bytes (fp32 tensor scale) per kernel; all kernel dims here are multiples of 16.
  packed_kernels = n_kernel // 2 + n_kernel // 256 + 4 * n_qt
  assert report["params_bytes"] - report["packed_bytes"] == 4 * n_kernel - packed_kernels
  assert report["saved_bytes"] == 4 * n_kernel - packed_kernels


def test_export_errors():
  params = _params()
  with pytest.raises(ValueError, match=r"does not quantize weights to block-scaled FP4"):
    export.pack(params, recipe="fp8")
  with pytest.raises(ValueError, match=r"select='nope' matches no weight"):
    export.pack(params, select="nope")
