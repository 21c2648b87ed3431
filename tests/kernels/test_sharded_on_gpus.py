"""The per-shard kernels compiled on two GPUs (skipped elsewhere; the CPU runs them in interpret mode on host devices:
test_quantize_sharded.py, test_dot_pallas.py).

* ``sharded.quantize_sharded`` over a mesh of two GPUs, rows or columns split, equals ``reference.quantize`` (the
  XLA quantizer, itself checked against the NumPy oracles) of the whole tensor: codes, block scales, tensor scale,
  dequantized values and trust mask, for every case of test_quantize_sharded.py at its shape and two larger ones.
* The token-sharded dot under ``jax.shard_map(check_vma=False)``: y, dX and the all-reduced dW with the per-shard
  kernels (``backend="pallas"``) equal the XLA quantizers' bit for bit, and y, dX equal the one-device dot's (dW is
  a sum of two partial GEMMs, so it rounds differently from one device's GEMM).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fp4jax_kernels import operand as kernel_operand
from fp4jax_kernels.quantize import reference, sharded
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import fp4jax
from tests import oracles
from tests.kernels import test_quantize_sharded as cases

GPUS = [d for d in jax.devices() if d.platform == "gpu"] if jax.default_backend() == "gpu" else []
pytestmark = pytest.mark.skipif(len(GPUS) < 2, reason=f"needs 2 GPUs, {len(GPUS)} visible")


@pytest.mark.parametrize("split", ["rows", "cols"])
@pytest.mark.parametrize("name", list(cases.CASES))
def test_sharded_kernel_on_two_gpus_is_the_whole_tensors_quantization(name, split):
  kw, shape, _ = cases.CASES[name]
  spec, output = cases._spec(kw)
  mesh = Mesh(np.array(GPUS[:2]), ("b",))
  key = jax.random.key(7)
  signs = jax.random.rademacher(jax.random.key(9), (16,), jnp.float32) if "signs" in name else None
  for size in (shape, (256, 512), (96, 256)):
    x = cases._input(size)
    want = reference.quantize(x, spec, key, output=output, signs=signs)
    spec_in = P("b", None) if split == "rows" else P(None, "b")
    got = sharded.quantize_sharded(
      x, spec, key, output=output, mesh=mesh, spec_in=spec_in, signs=signs, interpret=mesh.devices[0].platform == "cpu"
    )
    same = cases._same(got, want)
    assert all(same.values()), (size, same)


@pytest.mark.parametrize("recipe", ["nvfp4_rtn", "nvidia_nvfp4"])
@pytest.mark.parametrize("rows", [64, 256])
def test_token_sharded_dot_on_two_gpus_with_kernels_is_the_xla_dot(recipe, rows, monkeypatch):
  monkeypatch.setattr(kernel_operand, "AUTO_MIN_ELEMENTS", 0)
  mesh = Mesh(np.array(GPUS[:2]), ("data",))
  dn = (((1,), (1,)), ((), ()))
  x, w, dy = oracles.dyadic(1, (rows, 64), 6.0), oracles.dyadic(2, (32, 64), -6.0), oracles.dyadic(3, (rows, 32), 6.0)

  def run(backend, recipe_arg, sharded_run):
    def local(x, w, dy):
      f = lambda a, b: fp4jax.dot_general(a, b, dn, recipe=recipe_arg, backend=backend, key=jax.random.key(3))
      y, vjp = jax.vjp(f, x, w)
      dx, dw = vjp(dy)
      return y, dx, lax.psum(dw, "data") if sharded_run else dw

    if not sharded_run:
      return [np.asarray(t) for t in jax.jit(local)(x, w, dy)]
    rows_spec = P("data", None)
    specs = dict(in_specs=(rows_spec, P(), rows_spec), out_specs=(rows_spec, rows_spec, P()))
    return [np.asarray(t) for t in jax.jit(jax.shard_map(local, mesh=mesh, check_vma=False, **specs))(x, w, dy)]

  token_sharded = fp4jax.sharding.token_sharded(recipe, "data")
  one = run("xla", recipe, False)
  xla, pallas = (run(b, token_sharded, True) for b in ("xla", "pallas"))
  for label, got, want in zip(("y", "dx", "dw"), pallas, xla, strict=True):
    np.testing.assert_array_equal(got, want, err_msg=label)
  for label, got, want in zip(("y", "dx"), pallas, one, strict=False):
    np.testing.assert_array_equal(got, want, err_msg=label)
