"""The chex argument checks at the public boundary (``fp4jax._src.checks``): errors name the function, the argument
and what was expected, with the library's exception types (not chex's AssertionError)."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import fp4jax

DN = (((1,), (1,)), ((), ()))
X, W = jnp.ones((8, 32)), jnp.ones((16, 32))


def test_dot_general_rejects_an_integer_output_dtype():
  """Else the quantized product would be truncated to integers silently."""
  with pytest.raises(TypeError, match="fp4jax.dot_general: preferred_element_type must be a floating-point dtype"):
    fp4jax.dot_general(X, W, DN, recipe="nvfp4_rtn", preferred_element_type=jnp.int32)


@pytest.mark.parametrize(
  "key, error",
  [(0, TypeError), (jnp.ones(2), TypeError), (jax.random.split(jax.random.key(0)), ValueError)],
  ids=["int", "float_array", "batch_of_keys"],
)
def test_dot_general_and_einsum_reject_what_is_not_one_prng_key(key, error):
  with pytest.raises(error, match="fp4jax.dot_general: key must be one PRNG key"):
    fp4jax.dot_general(X, W, DN, recipe="quartet2", key=key)
  with pytest.raises(error, match="fp4jax.einsum: key must be one PRNG key"):
    fp4jax.einsum("mk,nk->mn", X, W, recipe="quartet2", key=key)


def test_dot_general_takes_typed_and_raw_keys():
  """Both keys pass the boundary check and the whole forward is traced with them (abstractly: the result's shape is
  all this checks, and jax.eval_shape gives it without compiling quartet2's forward)."""
  typed, raw = jax.random.key(1), jax.random.PRNGKey(1)
  y_typed = jax.eval_shape(lambda: fp4jax.dot_general(X, W, DN, recipe="quartet2", key=typed))
  y_raw = jax.eval_shape(lambda: fp4jax.dot_general(X, W, DN, recipe="quartet2", key=raw))
  assert y_typed.shape == y_raw.shape == (8, 16)


def test_einsum_names_its_own_operand():
  with pytest.raises(TypeError, match="fp4jax.einsum: b must be a floating-point array, got int32"):
    fp4jax.einsum("mk,nk->mn", X, W.astype(jnp.int32), recipe="nvfp4_rtn")


def test_packed_matmul_rejects_an_integer_out_dtype():
  w = fp4jax.quantize(W.T, fp4jax.NVFP4, axis=0)
  with pytest.raises(TypeError, match="fp4jax.packed_matmul: out_dtype must be a floating-point dtype"):
    fp4jax.packed_matmul(X, w, out_dtype=jnp.int8)


@pytest.mark.parametrize(
  "field, bad, error",
  [
    ("codes", lambda q: q.codes[:-1], ValueError),
    ("codes", lambda q: q.codes.astype(jnp.int8), TypeError),
    ("scales", lambda q: q.scales[..., :-1], ValueError),
    ("global_scale", lambda q: q.global_scale[None], ValueError),
  ],
  ids=["codes_shape", "codes_dtype", "scales_shape", "global_scale_shape"],
)
def test_packed_matmul_rejects_a_qtensor_whose_arrays_do_not_fit_its_metadata(field, bad, error):
  """A hand-built or corrupted QTensor (codes, scales or tensor scale of another shape or dtype) is refused before
  anything decodes it, for w and for a QTensor x; the error names the argument and the field."""
  w = fp4jax.quantize(W.T, fp4jax.NVFP4, axis=0)
  x = fp4jax.quantize(jnp.ones((8, 32)), fp4jax.NVFP4)
  for name, args in (
    ("w", (X, dataclasses.replace(w, **{field: bad(w)}))),
    ("x", (dataclasses.replace(x, **{field: bad(x)}), w)),
  ):
    with pytest.raises(error, match=rf"fp4jax.packed_matmul: {name}\.{field} (of shape .* does not fit|must be uint8)"):
      fp4jax.packed_matmul(*args)


def test_the_qtensor_check_states_the_expected_shape():
  w = fp4jax.quantize(jnp.ones((40, 16)), fp4jax.NVFP4, axis=0)  # K = 40 pads to 48: 24 code bytes along K
  with pytest.raises(ValueError, match=r"w.codes of shape \(20, 16\) does not fit .* \(expected \(24, 16\)\)"):
    fp4jax.packed_matmul(jnp.ones((2, 40)), dataclasses.replace(w, codes=w.codes[:20]))
