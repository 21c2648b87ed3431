"""The fused quantize kernel under each four-over-six metric (``NVFP4Format.four_over_six_metric``): the kernel
runs the foundation's block numerics (``quantize_blocks``), so it takes every metric, bit for bit as the reference."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fp4jax_kernels.quantize import pallas_triton, reference
from fp4jax_kernels.quantize.output import KernelOutput

import fp4jax


# slow tier; default representative: [max_abs] (the metric is a field of the foundation's block numerics, which the
# kernel runs whatever its value)
@pytest.mark.parametrize("metric", [pytest.param("l1", marks=pytest.mark.slow), "max_abs"])
def test_kernel_matches_reference_for_each_metric(metric, interpret):
  fmt = dataclasses.replace(fp4jax.NVFP4, scale_mode="four_over_six", four_over_six_metric=metric)
  spec, output = fp4jax.QuantizeSpec(fmt), KernelOutput(dequantize="block_scaled_only")
  x = jax.random.normal(jax.random.key(0), (32, 64)) * jnp.logspace(-2, 2, 64)
  got = pallas_triton.quantize(x, spec, None, output=output, tile=(16, 64), interpret=interpret)
  want = reference.quantize(x, spec, None, output=output)
  np.testing.assert_array_equal(np.asarray(got[0].codes), np.asarray(want[0].codes))
  np.testing.assert_array_equal(
    np.asarray(got[0].scales.astype(jnp.float32)), np.asarray(want[0].scales.astype(jnp.float32))
  )
  np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
  mse = reference.quantize(x, fp4jax.QuantizeSpec(dataclasses.replace(fmt, four_over_six_metric="mse")), None)
  assert not np.array_equal(
    np.asarray(mse[0].scales.astype(jnp.float32)), np.asarray(want[0].scales.astype(jnp.float32))
  )


def _te_spec():
  fmt = dataclasses.replace(
    fp4jax.NVFP4, scale_mode="four_over_six", four_over_six_metric="l1", four_over_six_reference="te"
  )
  return fp4jax.QuantizeSpec(fmt), KernelOutput(dequantize="block_scaled_only")


def test_kernel_refuses_te_reference(interpret):
  """The kernel raises the typed ``backends.Unsupported`` for TE's 4over6 arithmetic before it traces anything (the
  first check of the slow test below, which also compiles the reference ``"auto"`` falls back to)."""
  spec, output = _te_spec()
  x = jnp.ones((32, 64), jnp.float32)
  with pytest.raises(fp4jax.backends.Unsupported, match="four_over_six_reference='te'"):
    pallas_triton.quantize(x, spec, None, output=output, tile=(16, 64), interpret=interpret)


# slow tier; default representative: test_kernel_refuses_te_reference (the refusal), and on a CPU "auto" is the
# reference whatever the spec (test_quantize.py::test_api_auto_uses_reference_on_cpu_and_accepts_names)
@pytest.mark.slow
def test_kernel_refuses_te_reference_and_auto_falls_back(interpret):
  """TE's 4over6 arithmetic (``four_over_six_reference="te"``) runs only in the reference: the kernel raises the
  typed ``backends.Unsupported`` and ``backend="auto"`` gives the reference's bits."""
  from fp4jax_kernels.quantize import api

  fmt = dataclasses.replace(
    fp4jax.NVFP4, scale_mode="four_over_six", four_over_six_metric="l1", four_over_six_reference="te"
  )
  spec, output = fp4jax.QuantizeSpec(fmt), KernelOutput(dequantize="block_scaled_only")
  x = jax.random.normal(jax.random.key(1), (32, 64)) * jnp.logspace(-2, 2, 64)
  with pytest.raises(fp4jax.backends.Unsupported, match="four_over_six_reference='te'"):
    pallas_triton.quantize(x, spec, None, output=output, tile=(16, 64), interpret=interpret)
  got = api.quantize(x, spec, None, output=output, backend="auto", interpret=interpret)
  want = reference.quantize(x, spec, None, output=output)
  np.testing.assert_array_equal(np.asarray(got[0].codes), np.asarray(want[0].codes))
  np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
