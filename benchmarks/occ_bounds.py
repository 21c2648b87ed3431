"""Microsoft FP4's OCC clamp bounds (per-row quantiles) seven ways: radix selects, a sort, two top-k.

    python benchmarks/occ_bounds.py                       # GPU: the 125M model's X shapes, bfloat16
    python benchmarks/occ_bounds.py --shapes 64x128 --repeats 1   # CPU smoke

``fp4jax.estimators.occ_bounds(x, q, backend="xla")`` gives each row's order statistics of ranks ``floor((1−q)·n)`` and
``min(floor(q·n), n−1)`` by a most-significant-digit radix select (``estimators.default_radix_bits``: 2-bit digits for
32-bit floats, 1-bit for 16-bit ones, 16 counting passes over the row either way). These passes are candidates for the
XLA reductions that lead ms_fp4's 125M step profile (BENCHMARKS.md). ``radix_1bit``, ``radix_2bit`` and ``radix_4bit``
are the same select with fixed digits (1, 3 and 15 thresholds per rank and pass). The others give the same values:
``sort`` sorts each row's order-preserving integer keys (``estimators._order_keys``: −0 equal to +0, NaN after +Inf) and
reads the two ranks; ``top_k`` takes the (n − hi)-th largest key and, on the bit-inverted keys, the (lo + 1)-th
smallest, with ``jax.lax.top_k`` on int32 (k = 8 for a row of 768 at q = 0.99); ``top_k_float`` runs ``jax.lax.top_k``
on the floats themselves (NaN counted per row and put back where it reaches a rank, −0 returned as +0); ``pallas`` is
``occ_bounds(x, q, backend="pallas")`` (``fp4jax_kernels.select``, bfloat16 rows only, ``"auto"``'s choice on a GPU),
the 1-bit select with each row read once. Per shape: each method under ``jax.jit``, the median ms of ``--repeats`` timed
rounds (``benchtools.time_ms``), and whether its bounds equal the radix select's bit for bit on the same data
(``test_tensor``: outliers, signed zeros, ±Inf, NaNs). Writes ``benchmarks/results/occ_bounds.json``.
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import sys

if __package__ in (None, ""):  # run as a script: the repository root makes ``benchmarks`` importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.benchtools import commit, provenance, time_ms, write_json
from fp4jax._src import estimators

REPO = pathlib.Path(__file__).resolve().parents[1]
METHODS = ("radix", "radix_1bit", "radix_2bit", "radix_4bit", "sort", "top_k", "top_k_float", "pallas")
# "radix" is fp4jax's XLA occ_bounds (estimators.default_radix_bits digits: 1 bit for bfloat16, 2 for float32)
RADIX_BITS = {"radix_1bit": 1, "radix_2bit": 2, "radix_4bit": 4}
DEFAULT_SHAPES = ("16384x768", "16384x2048")  # the 125M step's X of q/k/v and gate/up (d 768), of down (d_ff 2048)


def _int_keys(x: jax.Array) -> jax.Array:
  """int32 keys ordered as the floats ``x`` (``_order_keys``, shifted into the signed range for 32-bit floats)."""
  keys = estimators._order_keys(x)
  if keys.dtype == jnp.uint16:
    return keys.astype(jnp.int32)
  return jax.lax.bitcast_convert_type(keys ^ jnp.uint32(1 << 31), jnp.int32)


def _from_int_keys(keys: jax.Array, dtype) -> jax.Array:
  """Inverse of ``_int_keys``."""
  if jnp.dtype(dtype).itemsize == 2:
    return estimators._from_order_keys(keys.astype(jnp.uint16), dtype)
  return estimators._from_order_keys(jax.lax.bitcast_convert_type(keys, jnp.uint32) ^ jnp.uint32(1 << 31), dtype)


def takes(method: str, dtype) -> bool:
  """Whether ``method`` runs on rows of ``dtype`` (the Pallas select takes bfloat16 rows only)."""
  return method != "pallas" or jnp.dtype(dtype) == jnp.bfloat16


def bounds(x: jax.Array, quantile: float, method: str) -> tuple[jax.Array, jax.Array]:
  """``(low, high)`` per row of ``x`` (last axis, keepdims) by ``method``, one of ``METHODS``."""
  lo, hi = estimators.occ_ranks(x.shape[-1], quantile)
  if method in ("radix", "pallas"):  # pallas: one read of each row, interpret mode off the GPU
    return estimators.occ_bounds(x, quantile, backend="xla" if method == "radix" else "pallas")
  if method in RADIX_BITS:
    return estimators.select_ranks(x, (lo, hi), radix_bits=RADIX_BITS[method])
  keys = _int_keys(x)
  if method == "sort":
    s = jnp.sort(keys, axis=-1)
    return _from_int_keys(s[..., lo : lo + 1], x.dtype), _from_int_keys(s[..., hi : hi + 1], x.dtype)
  if method == "top_k":
    high = jax.lax.top_k(keys, x.shape[-1] - hi)[0][..., -1:]
    low = ~jax.lax.top_k(~keys, lo + 1)[0][..., -1:]
    return _from_int_keys(low, x.dtype), _from_int_keys(high, x.dtype)
  if method == "top_k_float":  # top-k on the floats themselves (XLA's GPU TopK kernel takes f32 / bf16)
    n = x.shape[-1]
    nan = jnp.isnan(x)
    n_nan = jnp.sum(nan, axis=-1, keepdims=True)  # the NaNs hold the top n_nan ranks
    xf = jnp.where(nan, jnp.array(jnp.inf, x.dtype), x)
    high = jax.lax.top_k(xf, n - hi)[0][..., -1:]
    low = -jax.lax.top_k(-xf, lo + 1)[0][..., -1:]
    high = jnp.where(n_nan >= n - hi, jnp.array(jnp.nan, x.dtype), high)
    low = jnp.where(n_nan >= n - lo, jnp.array(jnp.nan, x.dtype), low)
    zero = jnp.zeros((), x.dtype)
    return jnp.where(low == 0, zero, low), jnp.where(high == 0, zero, high)  # -0 returned as +0
  raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def test_tensor(rows: int, cols: int, dtype) -> jax.Array:
  """A normal tensor with rare large outliers (as activations have), signed zeros and ±Inf in row 0, twelve NaNs in
  row 1 (more than the top rank's share of a row of up to 1200: its high bound is NaN) and one in the last row."""
  k1, k2 = jax.random.split(jax.random.key(0))
  x = jax.random.normal(k1, (rows, cols), jnp.float32)
  x = jnp.where(jax.random.uniform(k2, (rows, cols)) < 0.005, 40.0 * x, x)
  x = x.at[0, :4].set(jnp.array([0.0, -0.0, jnp.inf, -jnp.inf])).at[1 % rows, :12].set(jnp.nan).at[-1, -1].set(jnp.nan)
  return x.astype(dtype)


def measure(shapes: list[tuple[int, int]], dtypes: list[str], quantile: float, repeats: int) -> list[dict]:
  """One row per (shape, dtype): ms per method and whether each method's bounds equal the radix select's."""
  out = []
  for rows, cols in shapes:
    for dtype in dtypes:
      x = test_tensor(rows, cols, jnp.dtype(dtype))
      got, ms = {}, {}
      for method in (m for m in METHODS if takes(m, dtype)):
        fn = jax.jit(lambda x, method=method: bounds(x, quantile, method))
        got[method] = [np.asarray(b.astype(jnp.float32)) for b in fn(x)]
        ms[method] = time_ms(fn, x, repeats=repeats)
      same = {m: all(np.array_equal(a, b, equal_nan=True) for a, b in zip(got[m], got["radix"])) for m in list(got)[1:]}
      out.append({"rows": rows, "cols": cols, "dtype": dtype, "ms": ms, "same_as_radix": same})
  return out


def _shape(text: str) -> tuple[int, int]:
  try:
    rows, cols = (int(v) for v in text.lower().split("x"))
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected ROWSxCOLS, e.g. 16384x768, got {text!r}") from None
  if rows < 1 or cols < 2:
    raise argparse.ArgumentTypeError(f"expected at least 1 row and 2 columns, got {text!r}")
  return rows, cols


def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--shapes", nargs="+", type=_shape, default=[_shape(s) for s in DEFAULT_SHAPES], help="ROWSxCOLS")
  p.add_argument("--dtypes", nargs="+", default=["bfloat16"], choices=["bfloat16", "float32"])
  p.add_argument("--quantile", type=float, default=0.99, help="OCC's q (ms_fp4's clip_quantile)")
  p.add_argument("--repeats", type=int, default=7, help="timed rounds per method")
  p.add_argument("--commit", default=None, help="default: git rev-parse of this checkout")
  p.add_argument("--out", type=pathlib.Path, default=REPO / "benchmarks" / "results" / "occ_bounds.json")
  args = p.parse_args(argv)
  if args.repeats < 1:
    p.error(f"--repeats must be at least 1, got {args.repeats}")
  if not 0.5 < args.quantile <= 1:
    p.error(f"--quantile must be in (0.5, 1], got {args.quantile}")
  command = shlex.join(["python", "benchmarks/occ_bounds.py", *(argv if argv is not None else sys.argv[1:])])
  doc = {
    "benchmark": "occ_bounds",
    **provenance(args.commit or commit(), command),
    "settings": {"quantile": args.quantile, "repeats": args.repeats},
    "rows": measure(args.shapes, args.dtypes, args.quantile, args.repeats),
  }
  write_json(args.out, doc)
  for r in doc["rows"]:
    print(f"{r['rows']}x{r['cols']} {r['dtype']}: {r['ms']} same as radix: {r['same_as_radix']}")


if __name__ == "__main__":
  main()
