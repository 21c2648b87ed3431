"""``fp4jax.ragged_dot`` against ``jax.lax.ragged_dot`` (bf16) and a per-group NumPy oracle (every FP4 recipe).

The oracle (``_oracle``) quantizes each operand as the op's contract says, with ``tests/oracles.py``'s quantizers
written from the papers: X and dY as one tensor each over all groups (rows in no group zeroed), each expert's W as its
own tensor, and dYᵀ, Xᵀ of the weight-gradient GEMM on the tokens laid out group after group, each group zero-padded
to the wgrad GEMM's unit (lcm of its block and Hadamard sizes); then every group's three GEMMs are ``oracles.gemm``
of its rows (tokens) of those operands, in float64. Deterministic recipe variants (RTN, fixed signs) and dyadic
inputs as in test_oracles_dot.py.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax._src import recipes
from tests import oracles

M, K, N = 120, 64, 128  # Quartet II's backward Hadamard-128 runs along N (dgrad) and the tokens (wgrad)
SIZES = (37, 0, 70, 9)  # sums to 116 < M: the last 4 rows are in no group


def _experts(seed):
  return np.stack([oracles.dyadic(seed + e, (K, N), -6.0) for e in range(len(SIZES))])  # each expert's own peak


# ------------------------------------------------------------------------------------------------ the oracle


def _unit(recipe) -> int:
  """lcm of the wgrad GEMM's block sizes (block-scaled formats) and Hadamard sizes: no unit may straddle two
  groups."""
  units = [getattr(s.fmt, "block_size", 1) for s in recipe.operands("wgrad")]
  return math.lcm(*units, *(s.hadamard or 1 for s in recipe.operands("wgrad")))


def _rows(op: oracles.Operand, sl) -> oracles.Operand:
  scale = op.scale[sl] if np.ndim(op.scale) else op.scale
  return oracles.Operand(op.values[sl], scale, None if op.mask is None else op.mask[sl])


def _cols(op: oracles.Operand, sl) -> oracles.Operand:
  return oracles.Operand(op.values[:, sl], op.scale)


def _oracle(recipe, x, w, sizes, dy, fwd_signs=None, bwd_signs=None):
  """(y, dx, dw [g, k, n]) in float64 (see the module docstring)."""
  sg = lambda spec, s: (oracles.TE_SIGNS_16 if spec.signs == "te" else s) if spec.hadamard else None
  starts = np.cumsum((0,) + sizes)
  rows = [slice(starts[e], starts[e + 1]) for e in range(len(sizes))]
  x = np.where(np.arange(len(x))[:, None] < starts[-1], x, 0).astype(np.float32)
  dy = np.where(np.arange(len(dy))[:, None] < starts[-1], dy, 0).astype(np.float32)
  wt = [w[e].T for e in range(len(sizes))]  # each expert's W (n, k)
  y, dx, dw = np.zeros((M, N)), np.zeros((M, K)), np.zeros((len(sizes), N, K))
  xq = oracles.quantize(x, recipe.fwd_lhs, sg(recipe.fwd_lhs, fwd_signs))
  wq = [oracles.quantize(we, recipe.fwd_rhs, sg(recipe.fwd_rhs, fwd_signs)) for we in wt]
  a = oracles.quantize(dy, recipe.dgrad_lhs, sg(recipe.dgrad_lhs, bwd_signs))
  for e, r in enumerate(rows):
    y[r] = oracles.gemm(_rows(xq, r), wq[e])
    src = oracles._backward_source(recipe.dgrad_rhs, wt[e], wq[e]).T
    dx[r] = oracles.gemm(_rows(a, r), oracles.quantize(src, recipe.dgrad_rhs, sg(recipe.dgrad_rhs, bwd_signs)))
  if recipe.dgrad_rhs.source == "forward":
    dx = oracles._to_input(dx, recipe.fwd_lhs, xq, fwd_signs)
  unit = _unit(recipe)
  pad = lambda t, r: np.pad(t[r], ((0, -(r.stop - r.start) % unit), (0, 0)))
  layout = lambda t: np.concatenate([pad(t, r) for r in rows])  # (padded tokens, features)
  padded = np.cumsum([0] + [-(-(r.stop - r.start) // unit) * unit for r in rows])
  a = oracles.quantize(layout(dy).T, recipe.wgrad_lhs, sg(recipe.wgrad_lhs, bwd_signs))
  src = layout(oracles._backward_source(recipe.wgrad_rhs, x, xq))
  b = oracles.quantize(src.T, recipe.wgrad_rhs, sg(recipe.wgrad_rhs, bwd_signs))
  for e in range(len(sizes)):
    c = slice(padded[e], padded[e + 1])
    dw[e] = oracles.gemm(_cols(a, c), _cols(b, c))
    if recipe.wgrad_rhs.source == "forward":
      dw[e] = oracles._to_input(dw[e], recipe.fwd_rhs, wq[e], fwd_signs)
    if recipe.fwd_rhs.estimator == "dge":
      spec = recipe.fwd_rhs
      dw[e] *= oracles.dge_derivative(oracles.fl(wt[e]) * oracles.channel_gamma(wt[e]), spec.dge_k, spec.dge_cap)
  return y, dx, np.swapaxes(dw, 1, 2)


def _library(recipe, x, w, sizes, dy, key=None):
  def run(x, w, dy):
    y, vjp = jax.vjp(lambda a, b: fp4jax.ragged_dot(a, b, jnp.asarray(sizes, jnp.int32), recipe=recipe, key=key), x, w)
    return (y, *vjp(dy))

  return [np.asarray(t, np.float64) for t in jax.jit(run)(x, w, dy)]


RECIPES = {name: recipes.deterministic(name) for name in recipes.names() if name != "bf16"}
RECIPES["ms_fp4_fp4_grads"] = recipes.ms_fp4(fp4_gradients=True)  # per-row E2M1 scales along the tokens


# The default tier's case: quartet (MXFP4 with QuEST scales, its 32-point Hadamard: a 32-token wgrad unit, operands
# from the forward through the inverse rotation and the trust mask).
DEFAULT_RECIPES = ("quartet",)


# slow tier; default representative: [quartet] (the other recipes' quantizers: tests/test_oracles_dot.py)
@pytest.mark.parametrize(
  "name", [n if n in DEFAULT_RECIPES else pytest.param(n, marks=pytest.mark.slow) for n in sorted(RECIPES)]
)
def test_every_recipe_equals_per_group_gemms_on_the_same_quantized_operands(name):
  recipe = RECIPES[name]
  x, w, dy = oracles.dyadic(1, (M, K), 6.0), _experts(2), oracles.dyadic(3, (M, N), 6.0)
  d_fwd, d_bwd = recipe.fwd_lhs.hadamard, recipe.dgrad_lhs.hadamard
  fwd_signs = oracles.fixed_signs(d_fwd) if d_fwd and recipe.fwd_lhs.signs == "fixed" else None
  bwd_signs = oracles.fixed_signs(d_bwd) if d_bwd and recipe.dgrad_lhs.signs == "fixed" else None
  want = _oracle(recipe, x, w, SIZES, dy, fwd_signs, bwd_signs)
  got = _library(recipe, x, w, SIZES, dy)
  for g, t, what in zip(got, want, ("y", "dx", "dw")):
    oracles.assert_close(g, t, f"{name}: {what}")
  assert np.all(got[0][sum(SIZES) :] == 0) and np.all(got[1][sum(SIZES) :] == 0)


def test_bf16_equals_lax_ragged_dot_and_its_gradients_bit_for_bit():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(M, K)), jnp.bfloat16)
  w = jnp.asarray(rng.normal(size=(len(SIZES), K, N)), jnp.bfloat16)
  sizes = jnp.asarray(SIZES, jnp.int32)
  dy = jnp.asarray(rng.normal(size=(M, N)), jnp.bfloat16)

  def run(f):
    y, vjp = jax.vjp(f, x, w)
    return (y, *vjp(dy))

  ours = run(lambda x, w: fp4jax.ragged_dot(x, w, sizes, recipe="bf16"))
  theirs = run(lambda x, w: jax.lax.ragged_dot(x, w, sizes))
  for a, b in zip(ours, theirs):
    assert a.dtype == b.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_traced_group_sizes_past_m_are_cut_at_row_m_as_jax_does():
  """Under jit the sizes (20, 0, 200) of m = 48 rows act as (20, 0, 28), as in jax.lax.ragged_dot."""
  x, w, dy = (
    oracles.dyadic(1, (48, 32), 6.0),
    np.stack([oracles.dyadic(e, (32, 16), 6.0) for e in range(3)]),
    oracles.dyadic(3, (48, 16), 6.0),
  )

  def run(sizes, recipe):
    f = lambda x, w: fp4jax.ragged_dot(x, w, sizes, recipe=recipe)
    y, vjp = jax.vjp(f, x, w)
    return (y, *vjp(dy))

  traced = jax.jit(run, static_argnums=1)  # one program for both sizes (a concrete size runs the same ops)
  past = traced(jnp.asarray([20, 0, 200], jnp.int32), "nvfp4_rtn")
  cut = traced(jnp.asarray([20, 0, 28], jnp.int32), "nvfp4_rtn")
  for a, b in zip(past, cut):
    np.testing.assert_array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64))
  lax = jax.lax.ragged_dot(x, w, jnp.asarray([20, 0, 200], jnp.int32))
  np.testing.assert_array_equal(lax, jax.lax.ragged_dot(x, w, jnp.asarray([20, 0, 28], jnp.int32)))


def _nvidia_loss(x, w, sizes, key):
  return jnp.sum(fp4jax.ragged_dot(x, w, sizes, recipe="nvidia_nvfp4", key=key) ** 2)


# One compile for both tests below (x (40, 32), 2 experts (32, 16), traced group sizes, the key an argument).
_NVIDIA_VALUE_AND_GRAD = jax.jit(jax.value_and_grad(_nvidia_loss, (0, 1)))


# slow tier; default representative: test_traced_group_sizes_past_m_are_cut_at_row_m_as_jax_does (the same jitted
# grouped dot) and tests/test_dot.py::test_every_recipe_under_jit_grad_vmap_scan_checkpoint (fp4jax's dots under vmap)
@pytest.mark.slow
def test_vmap_over_independent_calls_equals_each_call():
  rng = np.random.default_rng(4)
  xs = jnp.asarray(rng.normal(size=(2, 40, 32)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(2, 32, 16)), jnp.float32)
  sizes = jnp.asarray([[10, 30], [25, 13]], jnp.int32)
  key = jax.random.key(7)

  batched = jax.jit(jax.vmap(jax.value_and_grad(_nvidia_loss, (0, 1)), (0, None, 0, None)))(xs, w, sizes, key)
  for i in range(2):
    one = _NVIDIA_VALUE_AND_GRAD(xs[i], w, sizes[i], key)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(batched)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[i])


def test_random_recipes_take_the_key():
  x, w = oracles.dyadic(1, (40, 32), 6.0), np.stack([oracles.dyadic(e, (32, 16), 6.0) for e in range(2)])
  sizes = jnp.asarray([17, 23], jnp.int32)
  a, b, c = (_NVIDIA_VALUE_AND_GRAD(x, w, sizes, jax.random.key(s))[1] for s in (0, 0, 1))  # (dx, dw)
  np.testing.assert_array_equal(a[1], b[1])
  assert not np.array_equal(a[1], c[1])


@pytest.mark.parametrize(
  "lhs, rhs, sizes, match",
  [
    ((8, 4, 1), (2, 4, 3), (4, 4), r"lhs \[m, k\].*lhs \(8, 4, 1\)"),
    ((8, 4), (4, 3), (4, 4), r"rhs \[g, k, n\].*rhs \(4, 3\)"),
    ((8, 4), (2, 5, 3), (4, 4), r"lhs's k = 4 must equal rhs's k = 5"),
    ((8, 4), (2, 4, 3), (4, 2, 2), r"group_sizes has 3 groups, rhs has g = 2"),
    ((8, 4), (2, 4, 3), (5, 4), r"group_sizes \[5, 4\] .* sum to at most lhs's m = 8"),
    ((8, 4), (2, 4, 3), (-1, 4), r"group_sizes \[-1, 4\] must be non-negative"),
  ],
)
def test_bad_shapes_are_named_at_trace_time(lhs, rhs, sizes, match):
  sizes = jnp.asarray(sizes, jnp.int32)  # concrete: checked when the jitted function is traced
  for recipe in ("bf16", "nvfp4_rtn"):
    with pytest.raises(ValueError, match=match):
      jax.eval_shape(
        lambda a, b: fp4jax.ragged_dot(a, b, sizes, recipe=recipe),
        jax.ShapeDtypeStruct(lhs, jnp.float32),
        jax.ShapeDtypeStruct(rhs, jnp.float32),
      )


def test_bad_arguments_raise_clear_errors():
  x, w, s = jnp.ones((8, 16)), jnp.ones((2, 16, 16)), jnp.asarray([4, 4], jnp.int32)
  with pytest.raises(TypeError, match="group_sizes must be an integer array"):
    fp4jax.ragged_dot(x, w, jnp.asarray([4.0, 4.0]), recipe="nvfp4_rtn")
  with pytest.raises(fp4jax.backends.Unsupported, match="backend='pallas' does not take ragged operands"):
    fp4jax.ragged_dot(x, w, s, recipe="nvfp4_rtn", backend="pallas")
  with pytest.raises(ValueError, match="is random: pass key"):
    fp4jax.ragged_dot(x, w, s, recipe="nvidia_nvfp4")
  tiled = recipes.Recipe("tiled_x", fwd_lhs=recipes.OperandSpec(fmt=fp4jax.NVFP4, block_shape=(16, 16)))
  with pytest.raises(ValueError, match=r"\['fwd_lhs'\] in 16x16 tiles across the tokens"):
    fp4jax.ragged_dot(x, w, s, recipe=tiled)


_MESH_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np, fp4jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
assert jax.device_count() >= 2 and jax.default_backend() == "__PLATFORM__", jax.devices()
rng = np.random.default_rng(0)
x = jnp.asarray(rng.normal(size=(64, 32)), jnp.float32)
w = jnp.asarray(rng.normal(size=(4, 32, 16)), jnp.float32)
s = jnp.asarray([10, 20, 0, 30], jnp.int32)
loss = lambda x, w: jnp.sum(fp4jax.ragged_dot(x, w, s, recipe="nvidia_nvfp4", key=jax.random.key(3)) ** 2)
f = jax.jit(jax.value_and_grad(loss, (0, 1)))
one = f(x, w)
mesh = Mesh(np.array(jax.devices()[:2]), ("expert",))
ws = jax.device_put(w, NamedSharding(mesh, P("expert")))
xs = jax.device_put(x, NamedSharding(mesh, P()))
two = f(xs, ws)
assert len(two[1][1].sharding.device_set) == 2
for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(two)):
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
print("OK")
"""


GPUS = len([d for d in jax.devices() if d.platform == "gpu"]) if jax.default_backend() == "gpu" else 0


@pytest.mark.parametrize(
  "platform",
  [
    # slow tier; default representative: an integration run (a 2-device mesh); its parts: the [gpu] case on the GPU
    # host and test_every_recipe_equals_per_group_gemms_on_the_same_quantized_operands
    pytest.param("cpu", marks=pytest.mark.slow),
    pytest.param("gpu", marks=pytest.mark.skipif(GPUS < 2, reason=f"needs 2 GPUs, {GPUS} visible")),
  ],
)
def test_experts_sharded_over_a_mesh_give_the_one_device_bits(platform):
  # cpu: two host devices (JAX_PLATFORMS=cpu, else a one-GPU machine's GPU would be the only device); gpu: the
  # machine's first two GPUs, compiled by XLA:GPU, memory allocated on demand (this process may hold some)
  if platform == "cpu":
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
  else:
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  script = _MESH_SCRIPT.replace("__PLATFORM__", platform)
  proc = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]
