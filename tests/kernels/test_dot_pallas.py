"""``fp4jax.dot_general(..., backend="pallas")``: the fused quantize kernels beneath the recipes' quantizers give the
same bits as the XLA path (forward output and both gradients, atol = rtol = 0, same key), every FP4 operand really
goes through a kernel, ``"auto"`` picks XLA off GPU, and operands the kernel cannot take are refused by name.

Off GPU the kernels run in Pallas interpret mode (slow to compile): tiny shapes, one jit per case.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fp4jax_kernels import operand as kernel_operand
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import fp4jax
from fp4jax._src import backends, operand, recipes
from fp4jax._src.formats import FP4Format
from fp4jax._src.recipes import OperandSpec
from tests import oracles

DN = (((1,), (1,)), ((), ()))
KEY = jax.random.key(11)
# (M, K, N): K a whole number of blocks; Quartet's backward RHT-32 needs M, N multiples of 32, Quartet II's RHT-128
# multiples of 128 (its forward has no Hadamard, so K stays small).
RECIPE_SHAPES = {
  "nvfp4_rtn": (48, 64, 32),
  "nvidia_nvfp4": (48, 64, 32),
  "quartet": (32, 64, 64),
  "quartet2": (128, 32, 128),
}
# one kernel quantizes X (forward and weight-gradient GEMMs), W (forward and data-gradient GEMMs) and dY (data- and
# weight-gradient GEMMs) where that pays (pallas_triton.pair_pays): not Quartet's X (its wgrad reuses the forward
# operand) nor its dY (rotated both ways: slower fused), not nvidia_nvfp4's W (16x16 tiles: one quantize serves
# both GEMMs), nor MS-EDEN's 128 points
FUSED_PAIRS = {"nvfp4_rtn": 3, "nvidia_nvfp4": 2, "quartet": 0, "quartet2": 0}


@pytest.fixture
def pallas_kernels(jaxpr_equations):
  """``pallas_kernels(jaxpr)``: names of the Pallas kernels a jaxpr calls, nested jaxprs included."""
  return lambda jaxpr: [
    str(e.params.get("name_and_src_info", e.params.get("name"))).split()[0]
    for e in jaxpr_equations(jaxpr)
    if e.primitive.name == "pallas_call"
  ]


def _fwd_bwd(recipe, backend):
  def run(x, w, dy, key):
    y, vjp = jax.vjp(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=recipe, key=key, backend=backend), x, w)
    return (y, *vjp(dy))

  return jax.jit(run)


def _inputs(m, k, n):
  kx, kw, kd = jax.random.split(jax.random.key(3), 3)
  x = jax.random.normal(kx, (m, k)) * jnp.logspace(-1, 1, k)  # columns over two decades: scales differ per block
  return (
    x.astype(jnp.bfloat16),
    jax.random.normal(kw, (n, k), jnp.bfloat16),
    jax.random.normal(kd, (m, n), jnp.bfloat16),
  )


@pytest.mark.parametrize(
  "name",
  # slow tier; default representative: [nvidia_nvfp4] (SR, RHT16 and the pair kernel in one dot)
  [r if r == "nvidia_nvfp4" else pytest.param(r, marks=pytest.mark.slow) for r in sorted(RECIPE_SHAPES)],
)
def test_pallas_backend_matches_xla_bit_for_bit(name, pallas_kernels):
  recipe = recipes.get(name)
  x, w, dy = _inputs(*RECIPE_SHAPES[name])
  traced = _fwd_bwd(recipe, "pallas").trace(x, w, dy, KEY)
  kernels = pallas_kernels(traced.jaxpr.jaxpr)
  n_fp4 = sum(isinstance(s.fmt, FP4Format) for s in recipe.specs)  # every FP4 operand quantized by the kernel
  assert sum(2 if k == "fp4_quantize_pair" else k.startswith("fp4_quantize_") for k in kernels) == n_fp4, kernels
  assert kernels.count("fp4_quantize_pair") == FUSED_PAIRS[name], kernels
  got = traced.lower().compile()(x, w, dy, KEY)
  want = _fwd_bwd(recipe, "xla")(x, w, dy, KEY)
  for what, g, r in zip(("y", "dx", "dw"), got, want):
    assert g.dtype == r.dtype, what
    g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
    assert np.all(np.isfinite(r)) and np.any(r != 0), what
    np.testing.assert_array_equal(g, r, err_msg=f"{name} {what}")


# slow tier; default representative: test_auto_is_xla_off_gpu_and_pallas_where_a_gpu_takes_the_operand (no pair for a
# batch, a kernel per batched operand) and test_pallas_backend_matches_xla_bit_for_bit[nvidia_nvfp4] (the dot's bits)
@pytest.mark.slow
def test_batched_dot_falls_back_to_one_quantize_per_operand(pallas_kernels):
  """With batch dims (B > 1) the pair kernel (2D) is not used; every operand still takes its own kernel and the
  result is the XLA path's, bit for bit."""
  dn = (((2,), (2,)), ((0,), (0,)))
  kx, kw, kd = jax.random.split(jax.random.key(4), 3)
  x, w = jax.random.normal(kx, (2, 32, 64), jnp.bfloat16), jax.random.normal(kw, (2, 16, 64), jnp.bfloat16)
  dy = jax.random.normal(kd, (2, 32, 16), jnp.bfloat16)

  def run(backend):
    def f(x, w, dy):
      y, vjp = jax.vjp(lambda a, b: fp4jax.dot_general(a, b, dn, recipe="nvfp4_rtn", key=KEY, backend=backend), x, w)
      return (y, *vjp(dy))

    return jax.jit(f)

  traced = run("pallas").trace(x, w, dy)
  kernels = pallas_kernels(traced.jaxpr.jaxpr)
  assert "fp4_quantize_pair" not in kernels and sum(k.startswith("fp4_quantize_") for k in kernels) == 6, kernels
  for g, r in zip(traced.lower().compile()(x, w, dy), run("xla")(x, w, dy)):
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(r, np.float32))


def test_forward_alone_quantizes_x_once(pallas_kernels):
  """Without a gradient the forward quantizes X for its own GEMM only: the pair kernel (which also writes the
  weight-gradient operand) runs only under differentiation."""
  x, w, _ = _inputs(*RECIPE_SHAPES["nvidia_nvfp4"])
  fwd = lambda x, w: fp4jax.dot_general(x, w, DN, recipe="nvidia_nvfp4", key=KEY, backend="pallas")
  kernels = pallas_kernels(jax.make_jaxpr(fwd)(x, w).jaxpr)
  assert [k for k in kernels if k.startswith("fp4_quantize")] == ["fp4_quantize_nvfp4_rtn"] * 2, kernels


@pytest.mark.parametrize(
  "spec, shape",
  [
    (OperandSpec(fmt=fp4jax.NVFP4, rounding="sr"), (2, 24, 48)),  # bits indexed across the folded rows
    (OperandSpec(fmt=fp4jax.NVFP4, block_shape=(16, 16)), (2, 32, 48)),  # 16x16 tiles inside each batch
    (OperandSpec(fmt=fp4jax.NVFP4, rounding="eden", hadamard=128, signs="random"), (3, 5, 128)),  # scale bits, signs
  ],
  ids=["sr_3d", "tiles16x16_3d", "ms_eden_3d"],
)
# slow tier; default representative: test_auto_is_xla_off_gpu_and_pallas_where_a_gpu_takes_the_operand (folded shapes
# and whole tiles per batch taken by the kernel) and test_pallas_backend_matches_xla_bit_for_bit[nvidia_nvfp4] (bits)
@pytest.mark.slow
def test_folded_operand_matches_xla(spec, shape):
  """Operands with leading dims are folded into rows for the kernel; random bits and tiles stay the XLA path's."""
  x = jax.random.normal(jax.random.key(5), shape, jnp.float32)
  signs = spec.sign_vector(jax.random.key(6))
  run = lambda backend: jax.jit(lambda x, k: operand.rotate_and_quantize(x, spec, k, signs, backend=backend))(x, KEY)
  (got, _), (want, _) = run("pallas"), run("xla")
  assert got.values.dtype == want.values.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got.values, np.float32), np.asarray(want.values, np.float32))
  np.testing.assert_array_equal(np.asarray(got.scale), np.asarray(want.scale))


def test_auto_is_xla_off_gpu_and_pallas_where_a_gpu_takes_the_operand(monkeypatch, pallas_kernels):
  x, w, dy = _inputs(48, 64, 32)
  on_triton = backends.has_pallas_triton()  # the test machine itself: XLA on CI's CPUs, the kernels on a GPU
  # a small layer stays on XLA everywhere (below kernel_operand.AUTO_MIN_ELEMENTS)
  assert not pallas_kernels(jax.make_jaxpr(_fwd_bwd("nvidia_nvfp4", "auto"))(x, w, dy, KEY).jaxpr)
  spec = OperandSpec(fmt=fp4jax.NVFP4)

  def on_kernel(shape, s, dtype=jnp.bfloat16, fused=False):
    """Whether "auto" quantizes an operand of ``shape`` as ``s`` with the kernel (traced, not run)."""
    if fused:
      f = lambda x: operand.rotate_and_quantize(x, s, KEY, None, backend="auto")
    else:
      f = lambda x: operand.quantize_operand(x, s, KEY, backend="auto")
    return bool(pallas_kernels(jax.make_jaxpr(f)(jnp.ones(shape, dtype)).jaxpr))

  big = (2, kernel_operand.AUTO_MIN_ELEMENTS // 128, 64)  # exactly the threshold's element count
  assert on_kernel(big, spec) == on_triton
  monkeypatch.setattr(backends, "has_pallas_triton", lambda device=None: True)  # as on an H100
  assert on_kernel(big, spec)
  assert not on_kernel((2, kernel_operand.AUTO_MIN_ELEMENTS // 128 - 1, 64), spec)  # one row below it: XLA
  monkeypatch.setattr(kernel_operand, "AUTO_MIN_ELEMENTS", 0)  # the kernels' own limits, at small shapes
  assert on_kernel((4, 8, 64), spec)
  assert not on_kernel((4, 8, 40), spec)  # not whole blocks
  assert not on_kernel((4, 8, 64), spec, jnp.float16)
  assert not on_kernel((8, 64), OperandSpec(fmt=fp4jax.formats.E4M3))
  assert not on_kernel((8, 64), OperandSpec(fmt=fp4jax.formats.E2M1_CHANNEL))
  eden = OperandSpec(fmt=fp4jax.NVFP4, rounding="eden", hadamard=128, signs="random")
  assert on_kernel((8, 256), eden, fused=True)
  assert not on_kernel((8, 256), eden, fused=False)  # MS-EDEN needs the kernel's own rotation
  assert on_kernel((3, 32, 64), OperandSpec(fmt=fp4jax.NVFP4, block_shape=(16, 16)))  # whole tiles in each batch
  assert not on_kernel((3, 24, 64), OperandSpec(fmt=fp4jax.NVFP4, block_shape=(16, 16)))  # tiles would straddle

  # one kernel for both directions of a tensor: 2D, both directions on the kernel, and a pair that pays
  def both(shape, rows, cols, backend="auto"):
    f = lambda x: operand.rotate_and_quantize_both(x, (rows, KEY, None), (cols, KEY, None), backend=backend)
    return "fp4_quantize_pair" in pallas_kernels(jax.make_jaxpr(f)(jnp.ones(shape, jnp.bfloat16)).jaxpr)

  rht16 = OperandSpec(fmt=fp4jax.NVFP4, rounding="sr", hadamard=16, signs="te")
  assert both((1, 32, 64), spec, rht16) and both((32, 64), spec, spec)
  assert not both((32, 64), spec, rht16, "xla") and not both((2, 32, 64), spec, rht16)  # XLA; a batch of them
  assert not both((32, 40), spec, spec)  # 40 is not whole blocks along the rows
  quartet = recipes.get("quartet").dgrad_lhs
  assert not both((64, 64), quartet, quartet)  # rotated both ways: slower fused
  assert (
    operand.rotate_and_quantize_both(jnp.ones((32, 64)), (spec, KEY, None), (spec, KEY, None), backend="xla") is None
  )  # each GEMM quantizes its own operand


def test_a_prequantized_w_takes_the_kernels_at_any_size_under_auto(monkeypatch, pallas_kernels):
  """A layer stack's W (``fp4jax.prequantize_weight``, then ``rhs_prequantized``) is quantized by the kernels under
  ``"auto"`` whatever its size, on a GPU that runs them: its forward tiles, and quartet2's data-gradient W
  re-quantized by MS-EDEN from them; X and dY of the same small layer, and a W that is not prequantized, stay on
  XLA (below ``AUTO_MIN_ELEMENTS``)."""
  monkeypatch.setattr(backends, "has_pallas_triton", lambda device=None: True)  # as on an H100 (traced, not run)
  x, w, dy = _inputs(128, 128, 128)
  pre = fp4jax.prequantize_weight(w, DN, recipe="quartet2")  # on the CPU: XLA's bits, the same as the kernels'

  def kernels(fn, *args):
    return pallas_kernels(jax.make_jaxpr(fn)(*args).jaxpr)

  assert kernels(lambda w: fp4jax.prequantize_weight(w, DN, recipe="quartet2"), w)
  assert not kernels(lambda w: fp4jax.prequantize_weight(w, DN, recipe="quartet2", backend="xla"), w)

  def fwd_bwd(pre):
    def run(x, w, dy):
      f = lambda a, b: fp4jax.dot_general(a, b, DN, recipe="quartet2", key=KEY, rhs_prequantized=pre)
      y, vjp = jax.vjp(f, x, w)
      return (y, *vjp(dy))

    return run

  assert not kernels(fwd_bwd(None), x, w, dy)  # nothing prequantized: every operand below the threshold is XLA's
  with_pre = kernels(fwd_bwd(pre), x, w, dy)
  assert with_pre  # the data gradient's W, re-quantized from the forward tiles (MS-EDEN, RHT-128)
  alone = kernels(
    lambda w: operand.rotate_and_quantize(w, recipes.get("quartet2").dgrad_rhs, KEY, None, backend="pallas"), w
  )
  assert sorted(with_pre) == sorted(alone)  # that quantization alone: X, dY and the GEMMs stay XLA's


def test_sharded_operands_take_the_global_amax_where_auto_offers_the_kernels(monkeypatch, pallas_kernels):
  """A token-sharded nvfp4_rtn dot under ``backend="auto"`` where the kernels are on offer (as on an H100, at any
  size): X and dY, split over the devices, are quantized by the per-shard kernel with the logical tensor's amax
  (``kernel_operand.quantize_sharded_operand``), not with one device's slice's amax; W, whole on every device, takes
  the pair kernel. Two token shards bound by ``jax.vmap`` (``fp4jax.sharding``: shard_map or vmap): y, dX
  (row-local) and the sum of the devices' dW equal the NumPy layer oracle on the whole tensors (tests/oracles.py;
  dyadic inputs whose peaks sit in shard 0, so shard 1's own amax would give other NVFP4 scales: y, dX, dW over 10%
  of their largest entry off)."""
  monkeypatch.setattr(backends, "has_pallas_triton", lambda device=None: True)
  monkeypatch.setattr(kernel_operand, "AUTO_MIN_ELEMENTS", 0)
  m, k, n, shards = 64, 64, 32, 2  # 32 tokens per shard: whole 16-element wgrad blocks along the tokens
  x, w, dy = oracles.dyadic(1, (m, k), 6.0), oracles.dyadic(2, (n, k), -6.0), oracles.dyadic(3, (m, n), 6.0)
  recipe = fp4jax.sharding.token_sharded("nvfp4_rtn", "data")

  def local(x, w, dy):
    y, vjp = jax.vjp(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=recipe, backend="auto"), x, w)
    return (y, *vjp(dy))

  args = (x.reshape(shards, m // shards, k), w, dy.reshape(shards, m // shards, n))
  traced = jax.jit(jax.vmap(local, in_axes=(0, None, 0), axis_name="data")).trace(*args)
  y, dx, dw = (np.asarray(t, np.float64) for t in traced.lower().compile()(*args))
  want = oracles.layer_grads(recipes.get("nvfp4_rtn"), x, w, dy)
  for got, ref, what in zip((y.reshape(m, n), dx.reshape(m, k), dw.sum(0)), want, ("y", "dx", "dw")):
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.max(np.abs(ref)), err_msg=what)
  kernels = pallas_kernels(traced.jaxpr.jaxpr)
  # W's pair, and each shard's X (for Y and dW) and dY (for dX and dW) by one pair kernel with the combined amaxes
  assert kernels.count("fp4_quantize_pair") == 3 and not kernels.count("fp4_quantize_nvfp4_rtn"), kernels


@pytest.mark.parametrize(
  "recipe_name, shape",
  [
    # slow tier; default representative: [nvidia_nvfp4] (the collective amax and SR bits at logical indices) and
    # test_sharded_operands_take_the_global_amax_where_auto_offers_the_kernels (nvfp4_rtn against the NumPy oracle)
    pytest.param("nvfp4_rtn", (64, 64, 32), marks=pytest.mark.slow),
    ("nvidia_nvfp4", (64, 64, 32)),
    # MS-EDEN's 128-point rotations: 128 tokens per shard, 128 outputs
    pytest.param("quartet2", (256, 128, 128), marks=pytest.mark.slow),
  ],
)
def test_explicit_pallas_on_a_sharded_recipe_gives_the_one_device_bits(
  recipe_name, shape, pallas_kernels, jaxpr_equations
):
  """``backend="pallas"`` with a token-sharded recipe: every sharded operand by the per-shard kernel (collective
  amax; nvidia_nvfp4's stochastic rounding of dY draws the bits of its logical indices), so y and dX equal the
  one-device XLA dot on the whole tensors bit for bit, and the devices' dW sum to its dW (up to the fp32 order of
  the sum over tokens). A per-shard amax or shard-local random bits would change y or dX. The kernels transpose and
  rotate the slices themselves (nvidia_nvfp4's Xᵀ and dYᵀ, quartet2's MS-EDEN ones): the program runs no XLA
  Hadamard (``fp4jax.hadamard``'s transform, a ``custom_jvp``), and nvidia_nvfp4's kernels all read stored bfloat16
  tensors, none an XLA-rotated float32 copy."""
  m, k, n = shape
  x, w, dy = _inputs(m, k, n)
  x = x.at[: m // 2].multiply(8)  # shard 0 holds the peaks: per-shard amaxes would differ from the tensor's
  recipe = fp4jax.sharding.token_sharded(recipe_name, "data")
  run = jax.vmap(lambda x, dy: _fwd_bwd(recipe, "pallas")(x, w, dy, KEY), axis_name="data")
  traced = jax.jit(run).trace(x.reshape(2, m // 2, k), dy.reshape(2, m // 2, n))
  y, dx, dw = traced.lower().compile()(x.reshape(2, m // 2, k), dy.reshape(2, m // 2, n))
  want_y, want_dx, want_dw = _fwd_bwd(recipe_name, "xla")(x, w, dy, KEY)
  np.testing.assert_array_equal(np.asarray(y).reshape(m, n), np.asarray(want_y))
  np.testing.assert_array_equal(np.asarray(dx).reshape(m, k), np.asarray(want_dx))
  # the same products over the m tokens, summed in fp32 in another order (K·eps32 of the largest entry: K terms,
  # whose |sum| is a few times max|dW| here), then each shard's partial and the one-device dW rounded once to
  # bf16 (w's dtype: unit roundoff 2^-8 of each of the three values)
  assert dw.dtype == want_dw.dtype == jnp.bfloat16
  parts, want_dw = np.asarray(dw, np.float64), np.asarray(want_dw, np.float64)
  fp32_sums = x.shape[0] * np.finfo(np.float32).eps * np.max(np.abs(want_dw))
  bound = 2.0**-8 * (np.abs(parts).sum(0) + np.abs(want_dw)) + fp32_sums
  assert np.all(np.abs(parts.sum(0) - want_dw) <= bound), np.max(np.abs(parts.sum(0) - want_dw) / bound)
  quantizers = [name for name in pallas_kernels(traced.jaxpr.jaxpr) if name.startswith("fp4_quantize")]
  # the sharded X, dY, dYᵀ, Xᵀ at least (a pair kernel quantizes two of them)
  assert sum(2 if name.startswith("fp4_quantize_pair") else 1 for name in quantizers) >= 4, quantizers
  equations = list(jaxpr_equations(traced.jaxpr.jaxpr))
  assert not [e for e in equations if e.primitive.name == "custom_jvp_call"]
  read = [e.invars[0].aval.dtype for e in equations if e.primitive.name == "pallas_call"]
  # quartet2 also re-quantizes float32 operands, as one device does
  assert recipe_name == "quartet2" or all(dtype == jnp.bfloat16 for dtype in read), read


def test_explicit_pallas_with_tokens_and_outputs_split_gives_the_one_device_bits(pallas_kernels):
  """Data parallelism with a column-parallel layer (``sharded(token_sharded(r, "data"), "model", "outputs")``, a
  2x2 grid bound by nested ``jax.vmap``), nvidia_nvfp4 by the kernels: X cut by "data", W by "model", dY by both.
  Each device's y is its block of the one-device XLA y bit for bit (X's and W's amaxes combined over their axes);
  the model shards' dX partials and the data shards' dW partials add up to the one-device dX and dW within the
  rounding of each partial to bf16 and the fp32 order of the sums (dY's amax over both axes and its stochastic
  rounding at logical indices: a shard-local amax or bit index moves whole FP4 steps, far beyond that)."""
  m, k, n = 64, 64, 64  # 32 tokens and 32 outputs per device: whole 16-element blocks and 16x16 weight tiles
  x, w, dy = _inputs(m, k, n)
  x = x.at[: m // 2].multiply(8)  # the peaks in data shard 0, and in W's model shard 0 and dY's block (0, 0)
  w, dy = w.at[: n // 2].multiply(8), dy.at[: m // 2, : n // 2].multiply(8)
  recipe = fp4jax.sharding.sharded(fp4jax.sharding.token_sharded("nvidia_nvfp4", "data"), "model", "outputs")
  inner = jax.vmap(lambda x, w, dy: _fwd_bwd(recipe, "pallas")(x, w, dy, KEY), (None, 0, 0), axis_name="model")
  run = jax.jit(jax.vmap(inner, (0, None, 0), axis_name="data"))
  args = (
    x.reshape(2, m // 2, k),
    w.reshape(2, n // 2, k),
    dy.reshape(2, m // 2, 2, n // 2).transpose(0, 2, 1, 3),  # [data, model]: dY's block (tokens, outputs)
  )
  traced = run.trace(*args)
  y, dx, dw = (np.asarray(a) for a in traced.lower().compile()(*args))
  want_y, want_dx, want_dw = (np.asarray(a) for a in _fwd_bwd("nvidia_nvfp4", "xla")(x, w, dy, KEY))
  np.testing.assert_array_equal(y.transpose(0, 2, 1, 3).reshape(m, n), want_y)
  # (partials [summed axis], want): dX summed over the model shards, dW over the data shards
  for parts, want in (
    (dx.astype(np.float64).transpose(1, 0, 2, 3).reshape(2, m, k), want_dx),
    (dw.astype(np.float64).reshape(2, n, k), want_dw),
  ):
    want = want.astype(np.float64)
    bound = 2.0**-8 * (np.abs(parts).sum(0) + np.abs(want)) + max(m, n) * np.finfo(np.float32).eps * np.abs(want).max()
    assert np.all(np.abs(parts.sum(0) - want) <= bound), np.max(np.abs(parts.sum(0) - want) / bound)
  quantizers = [name for name in pallas_kernels(traced.jaxpr.jaxpr) if name.startswith("fp4_quantize")]
  assert sum(2 if name.startswith("fp4_quantize_pair") else 1 for name in quantizers) >= 4, quantizers


@pytest.mark.parametrize(
  "recipe, shape, match",
  [
    # slow tier; default representative: the [fp8] case (the same error path) and the refusals of
    # test_auto_is_xla_off_gpu_and_pallas_where_a_gpu_takes_the_operand (E2M1_CHANNEL, partial blocks)
    pytest.param("ms_fp4", (16, 64, 16), "e2m1_channel", marks=pytest.mark.slow),
    ("fp8", (16, 64, 16), "fp8_e4m3"),
    pytest.param("nvfp4_rtn", (16, 40, 16), "whole number of 16-element blocks", marks=pytest.mark.slow),
  ],
)
def test_explicit_pallas_refuses_what_the_kernel_cannot_take(recipe, shape, match):
  x, w, dy = _inputs(*shape)
  with pytest.raises(ValueError, match=f"backend='pallas'.*OperandSpec.*{match}"):
    jax.make_jaxpr(_fwd_bwd(recipe, "pallas"))(x, w, dy, KEY)


def test_bad_backend_and_rotated_eden_are_named():
  x = jnp.ones((16, 64))
  with pytest.raises(ValueError, match="fp4jax.dot_general: backend must be one of"):
    fp4jax.dot_general(x, x, DN, recipe="nvfp4_rtn", backend="cuda")
  with pytest.raises(ValueError, match="backend='native': quantize_operand has no 'native' implementation"):
    fp4jax.dot_general(x, x, DN, recipe="nvfp4_rtn", backend="native")
  eden = OperandSpec(fmt=fp4jax.NVFP4, rounding="eden", hadamard=128, signs="random")
  with pytest.raises(ValueError, match="backend='pallas'.*MS-EDEN on an already rotated operand"):
    operand.quantize_operand(jnp.ones((4, 128)), eden, KEY, backend="pallas")


def test_core_import_does_not_load_pallas():
  """``import fp4jax`` (and tracing an XLA-backend dot) never imports the kernels: checked in a fresh interpreter."""
  code = (
    "import sys, jax, jax.numpy as jnp, fp4jax; "
    "jax.make_jaxpr(lambda a, b: fp4jax.dot_general(a, b, (((1,), (1,)), ((), ())), recipe='nvfp4_rtn', backend='xla'))"
    "(jnp.ones((4, 32)), jnp.ones((8, 32))); "
    "bad = [m for m in sys.modules if m.startswith('fp4jax_kernels') or 'pallas' in m]; "
    "assert not bad, bad"
  )
  subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize(
  "name",
  # slow tier; default representative: [nvfp4_rtn] (the composed dot), each kernel's own lowering in
  # tests/kernels/test_quantize.py::test_kernel_lowers_to_triton
  [r if r == "nvfp4_rtn" else pytest.param(r, marks=pytest.mark.slow) for r in sorted(RECIPE_SHAPES)],
)
def test_pallas_dot_lowers_for_cuda(name, monkeypatch):
  """The composed fwd+bwd (folded shapes, default tiles, fused Hadamards) lowers every kernel to Triton (on CPU, by
  lowering for CUDA with interpret mode off)."""
  monkeypatch.setattr(backends, "pallas_interpret", lambda device=None: False)
  x, w, dy = _inputs(*RECIPE_SHAPES[name])
  text = _fwd_bwd(name, "pallas").trace(x, w, dy, KEY).lower(lowering_platforms=("cuda",)).as_text()
  assert "@__gpu$xla.gpu.triton" in text


_SHARD_MAP_SCRIPT = """
import json, jax, jax.numpy as jnp, numpy as np, fp4jax
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P
from fp4jax._src import backends
from fp4jax_kernels import operand as kernel_operand
from tests import oracles

backends.has_pallas_triton = lambda device=None: True  # "auto" offers the kernels, as on an H100
kernel_operand.AUTO_MIN_ELEMENTS = 0
assert jax.device_count() == 2
mesh = Mesh(np.array(jax.devices()), ("data",))
recipe = fp4jax.sharding.token_sharded("nvfp4_rtn", "data")
dn = (((1,), (1,)), ((), ()))
x, w, dy = oracles.dyadic(1, (64, 64), 6.0), oracles.dyadic(2, (32, 64), -6.0), oracles.dyadic(3, (64, 32), 6.0)


def kernel_names(jaxpr):  # the Pallas kernels a jaxpr calls, nested jaxprs included
  names = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "pallas_call":
      names.append(str(eqn.params.get("name_and_src_info", eqn.params.get("name"))).split()[0])
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        names += kernel_names(getattr(sub, "jaxpr", sub)) if hasattr(getattr(sub, "jaxpr", sub), "eqns") else []
  return names


def varying(a):  # W's gradient is a partial sum per shard: under check_vma=True W must be typed as varying
  return lax.pvary(a, "data") if hasattr(lax, "pvary") else lax.pcast(a, "data", to="varying")


def run(backend, check_vma):
  def local(x, w, dy):
    w = varying(w) if check_vma else w
    y, vjp = jax.vjp(lambda a, b: fp4jax.dot_general(a, b, dn, recipe=recipe, backend=backend), x, w)
    dx, dw = vjp(dy)
    return y, dx, lax.psum(dw, "data")

  rows = P("data", None)
  specs = dict(in_specs=(rows, P(), rows), out_specs=(rows, rows, P()))
  f = jax.jit(jax.shard_map(local, mesh=mesh, check_vma=check_vma, **specs))
  try:
    kernels = kernel_names(f.trace(x, w, dy).jaxpr.jaxpr).count("fp4_quantize_pair")
    return [np.asarray(t).tolist() for t in f(x, w, dy)], kernels, None
  except ValueError as e:
    return None, None, str(e)


print(json.dumps({f"{b}_{v}": run(b, v) for b in ("xla", "auto", "pallas") for v in (True, False)}))
"""


@pytest.fixture(scope="module")
def shard_map_runs():
  """The token-sharded nvfp4_rtn dot (y, dX, psum'd dW) inside ``jax.shard_map`` on a 2-device CPU mesh (a
  subprocess: the device count is fixed before jax starts), for each backend and ``check_vma``: ``{name: (results,
  number of per-shard kernel calls in the jaxpr, error message or None)}``."""
  # two host CPU devices on any machine (a GPU host's one GPU would leave the mesh a device short)
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  proc = subprocess.run(
    [sys.executable, "-c", _SHARD_MAP_SCRIPT], cwd=root, env=env, capture_output=True, text=True, timeout=600
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


# slow tier; default representative: test_shard_map_with_check_vma_offers_auto_no_kernel (the fallback, traced on a
# one-device mesh) and test_sharded_operands_take_the_global_amax_where_auto_offers_the_kernels (the per-shard kernel)
@pytest.mark.slow
def test_shard_map_with_check_vma_falls_back_to_xla_under_auto(shard_map_runs):
  """Inside ``shard_map(check_vma=True)`` (JAX's default) a ``pallas_call``'s untyped outputs would fail the check:
  ``"auto"`` (the kernels on offer) refuses the per-shard kernel (``Unsupported``) and runs XLA, the same bits as
  ``backend="xla"``; with ``check_vma=False`` the per-shard kernel runs (Pallas interpret mode here), the same bits
  too; y, dX and dW equal the NumPy layer oracle on the whole tensors (dyadic inputs, tests/oracles.py)."""
  xla, _, error = shard_map_runs["xla_True"]
  assert error is None, error
  x, w, dy = oracles.dyadic(1, (64, 64), 6.0), oracles.dyadic(2, (32, 64), -6.0), oracles.dyadic(3, (64, 32), 6.0)
  want = oracles.layer_grads(recipes.get("nvfp4_rtn"), x, w, dy)  # the script's inputs
  for got, ref, what in zip(xla, want, ("y", "dx", "dw")):
    oracles.assert_close(np.asarray(got), ref, what)
  for name, kernels in (("auto_True", 0), ("auto_False", 3), ("pallas_False", 3)):
    got, count, error = shard_map_runs[name]
    assert error is None, (name, error)
    assert count == kernels, (name, count)  # W's pair kernel, and each shard's X and dY pairs where the kernels run
    for a, b, what in zip(got, xla, ("y", "dx", "dw")):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"{name} {what}")


def _shard_map_jaxpr(backend, check_vma):
  """The token-sharded nvfp4_rtn dot of ``_SHARD_MAP_SCRIPT``'s ``run`` inside ``jax.shard_map`` on a one-device mesh
  of this process, traced (not compiled): the varying-axes types under ``check_vma=True`` are those of any mesh."""
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  recipe = fp4jax.sharding.token_sharded("nvfp4_rtn", "data")
  x, w, dy = oracles.dyadic(1, (64, 64), 6.0), oracles.dyadic(2, (32, 64), -6.0), oracles.dyadic(3, (64, 32), 6.0)

  def local(x, w, dy):
    if check_vma:  # W's gradient is a partial sum per shard: under check_vma=True W must be typed as varying
      w = lax.pvary(w, "data") if hasattr(lax, "pvary") else lax.pcast(w, "data", to="varying")
    y, vjp = jax.vjp(lambda a, b: fp4jax.dot_general(a, b, DN, recipe=recipe, backend=backend), x, w)
    dx, dw = vjp(dy)
    return y, dx, lax.psum(dw, "data")

  rows = P("data", None)
  specs = dict(in_specs=(rows, P(), rows), out_specs=(rows, rows, P()))
  return jax.jit(jax.shard_map(local, mesh=mesh, check_vma=check_vma, **specs)).trace(x, w, dy).jaxpr.jaxpr


def test_shard_map_with_check_vma_offers_auto_no_kernel(monkeypatch, pallas_kernels):
  """Traced in this process: inside ``shard_map(check_vma=True)`` ``"auto"`` (the kernels on offer) runs no kernel
  (XLA); the same program with ``check_vma=False`` takes the kernels. The slow test above runs both on two devices,
  against the NumPy oracle."""
  monkeypatch.setattr(backends, "has_pallas_triton", lambda device=None: True)  # as on an H100
  monkeypatch.setattr(kernel_operand, "AUTO_MIN_ELEMENTS", 0)
  assert not pallas_kernels(_shard_map_jaxpr("auto", True))
  assert pallas_kernels(_shard_map_jaxpr("auto", False))


def test_explicit_pallas_in_shard_map_with_check_vma_names_check_vma_false():
  """``backend="pallas"`` has no fallback: inside ``shard_map(check_vma=True)`` it raises, naming the fix (traced in
  this process, on a one-device mesh)."""
  with pytest.raises(ValueError) as error:
    _shard_map_jaxpr("pallas", True)
  assert "backend='pallas'" in str(error.value) and "check_vma=False" in str(error.value), error.value
