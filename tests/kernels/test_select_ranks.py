"""The one-read per-row select (fp4jax_kernels.select) against a NumPy sort and the XLA select."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from fp4jax_kernels import triton_ir
from fp4jax_kernels.select import api
from fp4jax_kernels.select import pallas_triton as select

import fp4jax
from fp4jax._src import backends, estimators, operand


def _rows(m: int, n: int, seed: int = 0) -> np.ndarray:
  """bfloat16 rows with outliers, ties, signed zeros, ±Inf and NaNs (one NaN row reaching every rank)."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((m, n)).astype(np.float32)
  x[:, ::7] *= 40.0  # outliers
  x[:, 1::5] = np.round(x[:, 1::5])  # ties, and +0 / -0 from the rounding
  x[0, :3] = [-0.0, 0.0, -0.0]
  x[1, 5], x[1, 6] = np.inf, -np.inf
  x[2, 4] = np.nan
  x[3] = np.nan
  return x.astype(ml_dtypes.bfloat16)


def _sorted_rank(x: np.ndarray, rank: int) -> np.ndarray:
  """The oracle: NumPy's sort of each row's float32 values (NaN last; -0 and +0 compare equal), the value at
  ``rank``, -0 returned as +0."""
  v = np.sort(x.astype(np.float32), axis=1)[:, rank]
  return np.where(v == 0, np.float32(0.0), v)


def _same(got: jax.Array, want: np.ndarray) -> None:
  got = np.asarray(got.astype(jnp.float32))[:, 0]
  nan = np.isnan(want)
  np.testing.assert_array_equal(np.isnan(got), nan)
  np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))  # +0 is not -0 here


@pytest.mark.parametrize(("m", "n"), [(37, 640), (8, 1792), (5, 2048), (4, 7)])
def test_ranks_equal_a_numpy_sort_and_the_xla_select(m, n, interpret):
  x = _rows(m, n)
  ranks = (0, *estimators.occ_ranks(n, 0.99), n - 1)
  got = select.select_ranks(jnp.asarray(x), ranks, interpret=interpret)
  xla = estimators.select_ranks(jnp.asarray(x), ranks)
  for rank, g, ref in zip(ranks, got, xla):
    assert g.shape == (m, 1) and g.dtype == jnp.bfloat16
    _same(g, _sorted_rank(x, rank))
    np.testing.assert_array_equal(np.asarray(g).view(np.uint16), np.asarray(ref).view(np.uint16))


def test_order_keys_match_the_xla_keys_on_every_bfloat16():
  every = np.arange(2**16, dtype=np.uint16).view(ml_dtypes.bfloat16)
  keys = np.asarray(select.order_keys16(jnp.asarray(every)))
  want = np.asarray(estimators._order_keys(jnp.asarray(every))).astype(np.int32)
  np.testing.assert_array_equal(keys, want)


def test_bad_arguments_are_refused_naming_them():
  x = jnp.zeros((4, 8), jnp.bfloat16)
  with pytest.raises(ValueError, match=r"ranks must lie in \[0, 8\)"):
    select.select_ranks(x, (8,), interpret=True)
  with pytest.raises(TypeError, match="must be bfloat16"):
    select.select_ranks(x.astype(jnp.float32), (1,), interpret=True)
  with pytest.raises(ValueError, match="must be 2D"):
    select.select_ranks(x[None], (1,), interpret=True)


def test_ragged_rows_are_masked_in_triton():
  """Rows of 640 in tiles of 1024 columns, and a last tile past the rows: every load and store masked, or the GPU
  reads the next row's elements as this row's and writes past the outputs."""
  (module,) = triton_ir.triton_modules(lambda x: select.select_ranks(x, (6, 633)), jnp.ones((37, 640), jnp.bfloat16))
  accesses = [line for line in module.splitlines() if "tt.store" in line or ("tt.load" in line and "tensor<" in line)]
  assert sum("tt.store" in a for a in accesses) == 2 and any("tt.load" in a for a in accesses)
  for access in accesses:  # tt.load %ptr, %mask, %other / tt.store %ptr, %value, %mask
    assert access.split(":")[0].count("%") >= (4 if "tt.load" in access else 3), access


# ------------------------------------------------------------------------------------------------ the registered op
@pytest.mark.parametrize("backend", ["xla", "pallas"])
def test_occ_bounds_of_every_backend_are_a_numpy_sorts_order_statistics(backend):
  """One test for every implementation of SELECT_OP: rows with leading dims, along the last axis and a leading one."""
  x = _rows(24, 640, seed=3).reshape(2, 12, 640)
  lo_rank, hi_rank = estimators.occ_ranks(640, 0.99)
  lo, hi = jax.jit(lambda a: estimators.occ_bounds(a, 0.99, backend=backend))(jnp.asarray(x))
  assert lo.shape == hi.shape == (2, 12, 1) and lo.dtype == jnp.bfloat16
  _same(lo.reshape(24, 1), _sorted_rank(x.reshape(24, 640), lo_rank))
  _same(hi.reshape(24, 1), _sorted_rank(x.reshape(24, 640), hi_rank))
  xt = np.swapaxes(x, 1, 2)  # rows along axis 1
  lo_t, _ = estimators.occ_bounds(jnp.asarray(xt), 0.99, axis=1, backend=backend)
  assert lo_t.shape == (2, 1, 12)
  _same(lo_t.reshape(24, 1), _sorted_rank(x.reshape(24, 640), lo_rank))


def test_the_pallas_select_refuses_what_it_cannot_take_and_auto_falls_back():
  f32 = jnp.asarray(_rows(4, 64).astype(np.float32))
  with pytest.raises(backends.Unsupported, match="rows of float32"):
    estimators.occ_bounds(f32, 0.99, backend="pallas")
  with pytest.raises(backends.Unsupported, match=f"longer than MAX_ROW={api.MAX_ROW}"):
    api.select_ranks(jnp.zeros((1, api.MAX_ROW + 1), jnp.bfloat16), (0,))
  with pytest.raises(backends.Unsupported, match="empty"):
    api.select_ranks(jnp.zeros((0, 8), jnp.bfloat16), (0,))
  ranks = estimators.occ_ranks(64, 0.99)
  got = backends.run(estimators.SELECT_OP, "auto", f32, ranks, order=("pallas", "xla"))  # as "auto" on a GPU
  for g, rank in zip(got, ranks):
    _same(g, _sorted_rank(np.asarray(f32), rank))


@pytest.mark.parametrize("backend", ["xla", "pallas"])
def test_occ_clamp_gradient_is_one_inside_the_bounds_and_zero_outside(backend):
  """The bounds carry no gradient: d(sum clip(x, lo, hi))/dx is 1 strictly inside, 0 strictly outside."""
  x = jnp.asarray(_rows(8, 256, seed=5)[4:])  # rows without NaN or Inf
  lo, hi = (np.asarray(b, np.float32) for b in estimators.occ_bounds(x, 0.9, backend="xla"))
  g = jax.grad(lambda a: jnp.sum(estimators.occ_clamp(a, 0.9, backend=backend)[0].astype(jnp.float32)))(x)
  xf, g = np.asarray(x, np.float32), np.asarray(g, np.float32)
  inside, outside = (xf > lo) & (xf < hi), (xf < lo) | (xf > hi)
  assert inside.sum() > 800 and outside.sum() > 50
  np.testing.assert_array_equal(g[inside], 1.0)
  np.testing.assert_array_equal(g[outside], 0.0)


def test_ms_fp4_takes_the_pallas_select_under_auto_on_a_gpu_and_the_xla_one_when_named(monkeypatch, jaxpr_equations):
  """ms_fp4's forward X (OCC-clamped NVFP4-style operand) quantizes in XLA; its per-row bounds follow the
  quantizer's backend: the Pallas select where "auto" offers the kernels, XLA's where "xla" is named. Same bits."""
  spec = fp4jax.recipes.get("ms_fp4").fwd_lhs
  assert spec.clip == "occ"
  x = jnp.asarray(_rows(64, 256, seed=7)[4:])  # finite rows
  monkeypatch.setattr(backends, "has_pallas_triton", lambda device=None: True)  # as on an H100

  def run(backend):
    f = jax.jit(lambda a: operand.quantize_operand(a, spec, jax.random.key(0), backend=backend)[0].values)
    kernels = [
      str(e.params.get("name_and_src_info", e.params.get("name")))
      for e in jaxpr_equations(jax.make_jaxpr(f)(x).jaxpr)
      if e.primitive.name == "pallas_call"
    ]
    return f(x), kernels

  (auto, auto_kernels), (xla, xla_kernels) = run("auto"), run("xla")
  assert any("fp4_select_ranks" in k for k in auto_kernels) and not xla_kernels
  np.testing.assert_array_equal(np.asarray(auto, np.float32), np.asarray(xla, np.float32))


def test_a_bad_backend_name_is_refused_naming_the_entry():
  with pytest.raises(ValueError, match=r"fp4jax.estimators.occ_bounds: backend must be one of"):
    estimators.occ_bounds(jnp.zeros((2, 32), jnp.bfloat16), 0.99, backend="gpu")
