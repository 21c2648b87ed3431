"""The one-read per-row select (fp4jax_kernels.contrib.select_ranks) against a NumPy sort and the XLA select."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from fp4jax_kernels import triton_ir
from fp4jax_kernels.contrib import select_ranks as select

from fp4jax._src import estimators


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
