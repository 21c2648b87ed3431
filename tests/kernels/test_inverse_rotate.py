"""A backward gradient out of the rotated domain (fp4jax._src.operand.INVERSE_ROTATE_OP): every implementation (XLA's
and the Pallas kernel's) against a NumPy oracle written from fp4jax.hadamard's specification, the kernel's refusals
and fallback, its Triton lowering, and which implementation a rotated recipe's dot takes."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fp4jax_kernels import triton_ir
from fp4jax_kernels.rotate import api, pallas_triton

import fp4jax
from fp4jax._src import backends, hadamard, operand

DN = (((1,), (1,)), ((), ()))


def _oracle(g: np.ndarray, d: int, signs: np.ndarray | None, mask: np.ndarray | None) -> np.ndarray:
  """float32 NumPy (IEEE, subnormals kept): zero where the mask is False, then per d-chunk of the last axis
  log2(d) constant-geometry butterfly stages (x[i] ± x[i + d/2] to positions 2i, 2i + 1), times float32(1/sqrt(d)),
  times the signs."""
  x = np.where(mask, g, np.float32(0)) if mask is not None else g.copy()
  x = x.reshape(*g.shape[:-1], g.shape[-1] // d, d).astype(np.float32)
  for _ in range(int(math.log2(d))):
    a, b = x[..., : d // 2], x[..., d // 2 :]
    x = np.stack([a + b, a - b], axis=-1).reshape(x.shape)
  x = x * np.float32(1.0 / math.sqrt(d))
  if signs is not None:
    x = x * signs.astype(np.float32)
  return x.reshape(g.shape)


def _same_bits(got, want):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  ok = ~np.isnan(want)
  np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))


def _kernels(jaxpr_equations, f, *args) -> list[str]:
  eqns = jaxpr_equations(jax.make_jaxpr(f)(*args).jaxpr)
  return [
    str(e.params.get("name_and_src_info", e.params.get("name"))) for e in eqns if e.primitive.name == "pallas_call"
  ]


@pytest.mark.parametrize("backend", ["xla", "pallas"])
@pytest.mark.parametrize(
  ("shape", "d", "with_signs", "with_mask"),
  [((2, 37, 768), 32, True, True), ((5, 64), 16, False, False), ((3, 96), 32, False, True)],
)
def test_every_implementation_gives_the_oracles_bits(backend, shape, d, with_signs, with_mask, jaxpr_equations):
  rng = np.random.default_rng(0)
  g = rng.standard_normal(shape).astype(np.float32) * np.float32(3.0)
  g.reshape(-1)[[5, g.size - 7]] = [np.inf, np.nan]  # Inf and NaN spread through their chunks as IEEE says
  signs = hadamard.random_signs(jax.random.key(1), d) if with_signs else None
  mask = rng.random(shape) < 0.9 if with_mask else None
  f = jax.jit(lambda g, m: operand.inverse_rotate(g, d, signs, m, backend=backend))
  got = f(jnp.asarray(g), None if mask is None else jnp.asarray(mask))
  _same_bits(got, _oracle(g, d, None if signs is None else np.asarray(signs), mask))
  ran = _kernels(jaxpr_equations, f, jnp.asarray(g), None if mask is None else jnp.asarray(mask))
  assert any("fp4_inverse_rotate" in k for k in ran) == (backend == "pallas")


def test_the_kernel_refuses_what_it_cannot_take_and_the_op_falls_back_to_xla(jaxpr_equations):
  g = jnp.asarray(np.random.default_rng(1).standard_normal((4, 256)), jnp.float32)
  with pytest.raises(backends.Unsupported, match="bfloat16 gradient"):
    api.inverse_rotate(g.astype(jnp.bfloat16), 32, None, None)
  with pytest.raises(backends.Unsupported, match=f"d=128 > MAX_D={api.MAX_D}"):
    api.inverse_rotate(g, 128, None, None)
  with pytest.raises(backends.Unsupported, match="does not divide the row length 40"):
    api.inverse_rotate(g[:, :40], 16, None, None)
  f = lambda g: operand.inverse_rotate(g, 128, None, None, backend="pallas")  # MS-EDEN's size: XLA's butterflies
  _same_bits(f(g), _oracle(np.asarray(g), 128, None, None))
  assert not _kernels(jaxpr_equations, f, g)
  with pytest.raises(ValueError, match="must divide the length 40"):  # XLA names the bad length
    operand.inverse_rotate(g[:, :40], 16, None, None, backend="pallas")


def test_bad_kernel_arguments_are_refused_naming_them():
  g = jnp.zeros((4, 64), jnp.float32)
  with pytest.raises(ValueError, match="must be 2D float32"):
    pallas_triton.inverse_rotate(g[None], 32, interpret=True)
  with pytest.raises(ValueError, match=r"signs must have shape \(32,\)"):
    pallas_triton.inverse_rotate(g, 32, jnp.ones((16,)), interpret=True)
  with pytest.raises(ValueError, match=r"mask must have g's shape \(4, 64\)"):
    pallas_triton.inverse_rotate(g, 32, None, jnp.ones((4, 32), bool), interpret=True)


def test_ragged_rows_are_masked_in_triton():
  """37 rows in tiles of 32, each tile read and written as 4 vector parts of (32, 8, 1, 8) (8 contiguous elements of
  each 32-point chunk): every load (gradient and mask parts) and store of the last tile is masked, or the GPU reads
  and writes past the arrays."""
  g, mask = jnp.ones((37, 768), jnp.float32), jnp.ones((37, 768), bool)
  (module,) = triton_ir.triton_modules(lambda g, m: pallas_triton.inverse_rotate(g, 32, None, m), g, mask)
  parts = [line for line in module.splitlines() if "tensor<32x8x1x8x!tt.ptr" in line]
  loads, stores = [p for p in parts if "tt.load" in p], [p for p in parts if "tt.store" in p]
  assert sum("ptr<i8>" in a for a in loads) == 4 and len(loads) >= 8 and len(stores) == 4  # mask, gradient, result
  for access in loads + stores:  # tt.load %ptr, %mask, %other / tt.store %ptr, %value, %mask
    assert access.split(":")[0].count("%") >= (4 if "tt.load" in access else 3), access


def _quartet_grads(backend):
  f = lambda x, w: fp4jax.dot_general(x, w, DN, recipe="quartet", key=jax.random.key(5), backend=backend)
  return jax.jit(lambda x, w, dy: jax.vjp(f, x, w)[1](dy))


def _quartet_args():
  x = jax.random.normal(jax.random.key(2), (64, 256), jnp.float32)
  w = jax.random.normal(jax.random.key(3), (128, 256), jnp.float32)
  return x, w, jax.random.normal(jax.random.key(4), (64, 128), jnp.float32)


def test_a_rotated_recipes_backward_takes_the_registered_kernel_under_auto_on_a_gpu(monkeypatch, jaxpr_equations):
  """The library registers the kernel: it takes quartet's dX and dW out of the rotated domain where "auto" offers
  the kernels, XLA under "xla"; the same bits either way."""
  backends.load_plugins()
  assert backends.registered(operand.INVERSE_ROTATE_OP) == ("pallas", "xla")
  x, w, dy = _quartet_args()
  monkeypatch.setattr(backends, "has_pallas_triton", lambda device=None: True)  # as on an H100
  grads = _quartet_grads
  auto, xla = _kernels(jaxpr_equations, grads("auto"), x, w, dy), _kernels(jaxpr_equations, grads("xla"), x, w, dy)
  assert sum("fp4_inverse_rotate" in k for k in auto) == 2 and not xla
  for a, b in zip(grads("auto")(x, w, dy), grads("xla")(x, w, dy)):
    _same_bits(a, b)


def test_a_bad_backend_name_is_refused_naming_the_entry():
  with pytest.raises(ValueError, match=r"fp4jax.operand.inverse_rotate: backend must be one of"):
    operand.inverse_rotate(jnp.zeros((2, 32), jnp.float32), 32, None, backend="gpu")
