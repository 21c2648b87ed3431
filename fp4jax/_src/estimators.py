"""Backward rules of the forward quantizers: straight-through, trust mask, DGE, and outlier clamping (OCC).

In ``fp4jax.dot_general`` a forward operand ``x`` is replaced by its quantized ``Q(x)``; the gradient that arrives
for ``Q(x)`` is mapped back to ``x`` by the operand's estimator:

* straight-through (STE, Bengio et al. 2013): ``∂x = ∂Q(x)``.
* trust mask (QuEST / Quartet, arXiv 2502.05003, 2505.14669): ``∂x̂ = 1[|x̂/s| < 6] ⊙ ∂Q(x̂)`` with ``x̂`` the
  (rotated) operand and ``s`` its block decode scale; gradient is dropped where the value was clipped.
* DGE (Microsoft FP4, arXiv 2501.17116): the quantizer is smoothed inside each E2M1 interval and the gradient is
  multiplied by the smooth function's derivative evaluated at the scaled value (``dge_derivative``).
* OCC (same paper): before quantizing, clamp to per-row quantiles; the clamped-off residual is added back at high
  precision (``occ_clamp``); its gradient is straight-through.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fp4jax._src import backends
from fp4jax._src.backends import Backend
from fp4jax._src.formats import E2M1_MAX
from fp4jax._src.ieee import widen

# The per-row select of ``occ_bounds`` as an op of ``fp4jax.backends``' registry: ``impl(x, ranks)`` gives
# ``select_ranks(x, ranks)``'s values (rows along the last axis, any leading dims). XLA: ``select_ranks`` (registered
# below); Pallas: ``fp4jax_kernels.select`` (bfloat16 rows, each read once).
SELECT_OP = "select_ranks"


def trust_mask(x: jax.Array, scale: jax.Array) -> jax.Array:
  """``|x| < 6 · scale`` elementwise (bool): where E2M1 quantization with decode scale ``scale`` did not clip.

  ``scale`` broadcasts against ``x`` (the per-element block decode scale times any tensor scale). Division-free,
  so the boundary ``|x| = 6·s`` is exact (it counts as clipped, as ``|x̂/s| < 6`` in Quartet).

  Args:
    x: the (rotated) operand, any float dtype; compared in float32.
    scale: float32 decode scale, broadcastable against ``x``.

  Returns:
    bool array of the broadcast shape of ``x`` and ``scale``: True where ``|x| < 6 · scale`` (False for NaN).
  """
  return jnp.abs(widen(x)) < jnp.float32(E2M1_MAX) * scale


def dge_derivative(x: jax.Array, k: float = 5.0, cap: float = 3.0) -> jax.Array:
  """Derivative of Microsoft FP4's differentiable E2M1 quantizer at the scaled values ``x`` (arXiv 2501.17116, Eq. 8).

  Inside an E2M1 interval [lo, lo + δ] the hard step is replaced by
  ``f(u) = (δ/2)·(1 + sign(2u/δ − 1)·|2u/δ − 1|^(1/k))`` with ``u = |x| − lo``, whose derivative is

      ``f'(x) = (1/k) · |2u/δ − 1|^(1/k − 1)``,   capped at ``cap``

  (symmetric in the sign of ``x``; at the interval midpoint the uncapped value is infinite, so it is ``cap``).
  Magnitudes at or above 6 use the top interval [4, 6]. With k = 5, f'(±6) = f'(grid point) = 1/k = 0.2
  (MS-AMP's bf16 kernel reports 0.2002). Averaged over an interval f' is 1 uncapped; the cap removes mass near the
  midpoint, so for k = 5, cap 3 the mean is 1 − t*^(1/k) + 3·t* ≈ 0.59 with t* = (1/(3k))^(k/(k−1)): DGE shrinks
  weight gradients by ~40% on average. The power is a transcendental: last-ulp differences between backends.

  Args:
    x: values already divided by their scale (on the E2M1 range), any shape and float dtype.
    k: the smoothing exponent, > 1 (the paper's 5).
    cap: the largest derivative returned.

  Returns:
    float32 array of ``x``'s shape: ``f'(x)`` in (0, ``cap``]; NaN where ``x`` is NaN.

  Raises:
    ValueError: ``k <= 1``.
  """
  if k <= 1:
    raise ValueError(f"dge_derivative: k must be > 1 (a smooth step), got {k}")
  a = jnp.minimum(jnp.abs(widen(x)), E2M1_MAX)
  two_over_delta = jnp.where(a < 2.0, 4.0, jnp.where(a < 4.0, 2.0, 1.0))
  lo = jnp.where(a < 2.0, jnp.floor(a * 2.0) * 0.5, jnp.where(a < 4.0, 2.0 + jnp.floor(a - 2.0), 4.0))
  t = jnp.abs((a - lo) * two_over_delta - 1.0)
  safe = jnp.where(t > 0, t, 1.0)
  d = jnp.where(t > 0, (1.0 / k) * safe ** (1.0 / k - 1.0), jnp.float32(cap))
  return jnp.where(jnp.isnan(x), widen(x), jnp.minimum(d, cap))


def occ_bounds(
  x: jax.Array, quantile: float, axis: int = -1, *, backend: Backend = "auto"
) -> tuple[jax.Array, jax.Array]:
  """Per-row ``(low, high)`` clamp bounds along ``axis`` (Microsoft FP4's token-wise quantile clipping).

  The order statistics of ranks ``floor((1−q)·n)`` and ``min(floor(q·n), n−1)`` (0-based, ascending) of each row,
  found without sorting (``select_ranks``): the values ``jnp.sort`` would put at those ranks (−0 and +0 equal,
  returned as +0; NaN after +Inf, so a bound is NaN only when the NaNs reach its rank). Every backend gives the same
  bits. The bounds carry no gradient (an order statistic's is zero almost everywhere; OCC's is straight-through).

  Args:
    x: float array; its rows run along ``axis`` (length ``n``).
    quantile: ``q``, the upper quantile, normally in (0.5, 1] (e.g. 0.99).
    axis: the axis along which rows run.
    backend: ``SELECT_OP``'s implementation (``fp4jax.backends``): ``"auto"`` takes the Pallas select on a GPU that
      runs it (bfloat16 rows), else XLA's.

  Returns:
    ``(low, high)``: two arrays of ``x``'s dtype and shape with ``axis`` of length 1 (keepdims).

  Raises:
    ValueError: a rank falls outside [0, n): an empty row, or ``quantile`` too far outside (0, 1]; or ``backend``
      is not a backend name.
  """
  backend = backends.check(backend, "fp4jax.estimators.occ_bounds")
  rows = jax.lax.stop_gradient(jnp.moveaxis(x, axis, -1))
  lo, hi = backends.run(SELECT_OP, backend, rows, occ_ranks(x.shape[axis], quantile))
  return jnp.moveaxis(lo, -1, axis), jnp.moveaxis(hi, -1, axis)


def occ_ranks(n: int, quantile: float) -> tuple[int, int]:
  """``occ_bounds``' two 0-based ascending ranks in a row of length ``n``: ``floor((1−q)·n)`` and
  ``min(floor(q·n), n−1)``."""
  return int((1.0 - quantile) * n), min(int(quantile * n), n - 1)


def _order_keys(x: jax.Array) -> jax.Array:
  """Unsigned integers ordered as the floats ``x``: ``bits | signbit`` for ``x >= 0``, ``~bits`` for ``x < 0``;
  −0 maps to +0's key and every NaN to the largest key (after +Inf)."""
  nbits = 8 * x.dtype.itemsize
  utype, sign = jnp.dtype(f"uint{nbits}"), 1 << (nbits - 1)
  b = jax.lax.bitcast_convert_type(jnp.where(x == 0, jnp.zeros_like(x), x), utype)
  key = jnp.where(b >> (nbits - 1) == 1, ~b, b | utype.type(sign))
  return jnp.where(jnp.isnan(x), jnp.array(np.iinfo(utype).max, utype), key)


def _from_order_keys(key: jax.Array, dtype) -> jax.Array:
  """Inverse of ``_order_keys`` (the largest key decodes to a NaN)."""
  nbits = 8 * key.dtype.itemsize
  sign = key.dtype.type(1 << (nbits - 1))
  return jax.lax.bitcast_convert_type(jnp.where(key >= sign, key ^ sign, ~key), dtype)


def default_radix_bits(nbits: int) -> int:
  """``select_ranks``' digit width (key bits per counting pass: ``2^b − 1`` counts per rank and pass,
  ``nbits / b`` passes) for ``nbits``-bit keys: 1 for 16-bit keys and narrower, 2 for wider ones, the fastest of
  1, 2 and 4 bits on the 125M step's row shapes (BENCHMARKS.md, ``benchmarks/occ_bounds.py``)."""
  return 1 if nbits <= 16 else 2


def select_ranks(x: jax.Array, ranks: tuple[int, ...], radix_bits: int | None = None) -> tuple[jax.Array, ...]:
  """For each 0-based ``rank``, the value at that rank of every row of ``x`` sorted ascending along the last axis
  (keepdims), by a most-significant-digit radix select on ``_order_keys``: with the key's higher digits ``p``
  settled, the next digit is the number of ``j ≥ 1`` with ``#{key < p + j·2^s} ≤ rank`` (counts rise with j), so
  ``8·itemsize / radix_bits`` counting passes over ``x`` give the exact key (a streaming read per pass instead of
  a sort). ``radix_bits``: the digit width (default ``default_radix_bits``); every width gives the same values. Ties and
  signed zeros as in ``occ_bounds``."""
  n = x.shape[-1]
  if not ranks or any(not 0 <= r < n for r in ranks):
    raise ValueError(f"select_ranks: ranks must lie in [0, {n}) for rows of length {n}, got {ranks}")
  keys = _order_keys(x)
  utype, nbits = keys.dtype, 8 * x.dtype.itemsize
  radix_bits = default_radix_bits(nbits) if radix_bits is None else radix_bits
  if radix_bits < 1 or nbits % radix_bits:
    raise ValueError(f"select_ranks: radix_bits={radix_bits} must divide the {nbits}-bit keys of {x.dtype}")
  rank = jnp.asarray(ranks, jnp.int32)[:, None]  # (R, 1): one row of thresholds per rank
  digits = jnp.arange(1, 2**radix_bits, dtype=utype)  # (J,)

  def settle_digit(step, found):  # found: (..., R, 1), the key's digits above the shift settled
    shift = (jnp.asarray(nbits - radix_bits, jnp.int32) - radix_bits * step).astype(utype)
    thresholds = found + (digits << shift)  # (..., R, J)
    below = jnp.sum(keys[..., None, None, :] < thresholds[..., None], axis=-1, dtype=jnp.int32)  # (..., R, J)
    digit = jnp.sum(below <= rank, axis=-1, keepdims=True, dtype=jnp.int32).astype(utype)
    return found + (digit << shift)

  # the zero start is computed from the keys so that it varies over the same shard_map axes as the loop's result
  start = (keys[..., None, :1] & utype.type(0)) + jnp.zeros((len(ranks), 1), utype)  # (..., R, 1)
  found = jax.lax.fori_loop(0, nbits // radix_bits, settle_digit, start)
  values = _from_order_keys(found, x.dtype)  # (..., R, 1)
  return tuple(values[..., i, :] for i in range(len(ranks)))


def occ_clamp(
  x: jax.Array, quantile: float = 0.99, axis: int = -1, rows=None, *, backend: Backend = "auto"
) -> tuple[jax.Array, jax.Array]:
  """``(x_c, r)``: ``x`` clamped to its per-row quantile bounds (``occ_bounds``) and the residual ``r = x − x_c``.

  ``r`` is non-zero only at the outliers and is added back to ``Q(x_c)`` at high precision (OCC). NaN rows stay NaN.

  Args:
    x: float array to clamp.
    quantile: the upper quantile of ``occ_bounds``.
    axis: the axis along which rows run.
    rows: the whole rows the bounds are taken from when ``x`` holds a slice of them (default ``x``); the bounds must
      broadcast against ``x``.
    backend: the bounds' select (``occ_bounds``).

  Returns:
    ``(x_c, r)``, both of ``x``'s shape and dtype, with ``x_c + r == x`` up to rounding of the subtraction.

  Raises:
    ValueError: as ``occ_bounds``.
  """
  lo, hi = occ_bounds(x if rows is None else rows, quantile, axis, backend=backend)
  xc = jnp.clip(x, lo, hi)
  return xc, x - xc


backends.register(SELECT_OP, "xla", select_ranks)
