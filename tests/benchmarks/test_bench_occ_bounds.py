"""benchmarks/occ_bounds.py: every method gives the order statistics NumPy's sort gives, and the command's JSON and
its report section (no timings asserted)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import occ_bounds, report


def _numpy_bounds(x: np.ndarray, quantile: float) -> tuple[np.ndarray, np.ndarray]:
  """The oracle, from the definition: each row sorted ascending (NaN last, as NumPy sorts), the values at ranks
  floor((1 − q)·n) and min(floor(q·n), n − 1), a zero returned as +0."""
  n = x.shape[-1]
  lo, hi = int((1.0 - quantile) * n), min(int(quantile * n), n - 1)
  s = np.sort(x.astype(np.float32), axis=-1)
  return tuple(np.where(v == 0, np.float32(0.0), v) for v in (s[:, lo], s[:, hi]))


@pytest.mark.parametrize(
  ("method", "dtype"),
  [(m, d) for m in occ_bounds.METHODS for d in ("bfloat16", "float32") if occ_bounds.takes(m, d)],
)
def test_every_method_gives_the_sorted_order_statistics(method, dtype):
  x = occ_bounds.test_tensor(6, 768, jnp.dtype(dtype))
  x = x.at[2].set(jnp.asarray(np.r_[np.zeros(380), -np.zeros(388)], dtype))  # a row of signed zeros only
  x = x.at[3, 100:108].set(jnp.nan).at[4, 200:207].set(jnp.nan)  # 8 NaNs reach rank 760 of 768, 7 do not
  want = _numpy_bounds(np.asarray(x.astype(jnp.float32)), 0.99)
  got = [np.asarray(b.astype(jnp.float32))[:, 0] for b in occ_bounds.bounds(x, 0.99, method)]
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)  # NaN where NaN, same bits elsewhere
    assert not np.signbit(g[g == 0]).any()  # −0 returned as +0
  assert np.isnan(got[1][[1, 3]]).all() and not np.isnan(got[1][4]) and not np.isnan(got[0]).any()


def test_unknown_method_is_refused():
  with pytest.raises(ValueError, match="method must be one of"):
    occ_bounds.bounds(jnp.zeros((2, 8)), 0.99, "bisect")


def test_command_writes_its_document_and_the_report_renders_it(tmp_path, capsys):
  out = tmp_path / "occ.json"
  occ_bounds.main(["--shapes", "4x64", "--repeats", "1", "--commit", "abc1234", "--out", str(out)])
  doc = json.loads(out.read_text())
  assert (doc["benchmark"], doc["commit"], doc["platform"]) == ("occ_bounds", "abc1234", "cpu")
  assert "--shapes 4x64" in doc["command"] and doc["settings"] == {"quantile": 0.99, "repeats": 1}
  (row,) = doc["rows"]
  assert (row["rows"], row["cols"], row["dtype"]) == (4, 64, "bfloat16") and set(row["ms"]) == set(occ_bounds.METHODS)
  assert row["same_as_radix"] == dict.fromkeys(occ_bounds.METHODS[1:], True)
  section = "\n".join(report._occ_bounds(doc))
  assert (
    "| 4x64 | bfloat16 |" in section
    and "radix_1bit yes, radix_2bit yes, radix_4bit yes, sort yes, top_k yes, top_k_float yes, pallas yes" in section
  )
  # float32 rows: the Pallas select does not take them, its cell is a dash
  occ_bounds.main(["--shapes", "4x64", "--dtypes", "bfloat16", "float32", "--repeats", "1", "--out", str(out)])
  section = "\n".join(report._occ_bounds(json.loads(out.read_text())))
  f32 = next(line for line in section.splitlines() if line.startswith("| 4x64 | float32 |"))
  assert f32.split(" | ")[-2] == "—" and "pallas" not in f32
  with pytest.raises(SystemExit):
    occ_bounds.main(["--shapes", "4x1"])
  assert "expected at least 1 row and 2 columns" in capsys.readouterr().err


@pytest.mark.parametrize(
  ("args", "match"),
  [
    (["--repeats", "0"], "--repeats must be at least 1, got 0"),
    (["--quantile", "0.4"], "--quantile must be in (0.5, 1], got 0.4"),
    (["--shapes", "16x"], "expected ROWSxCOLS, e.g. 16384x768, got '16x'"),
  ],
)
def test_bad_arguments_are_refused_naming_the_flag(args, match, capsys):
  with pytest.raises(SystemExit):
    occ_bounds.main(args)
  assert match in capsys.readouterr().err
