"""User entry for the fused quantize: picks an implementation per device and shape (``fp4jax.backends``).

Implementations sit behind one signature, ``impl(x, spec, key, *, signs) -> Quantized``, in
``IMPLEMENTATIONS``; a Mosaic GPU kernel can be added beside the Triton one without touching callers.
``fp4jax.operand`` calls this (backend ``"pallas"``) beneath ``fp4jax.dot_general``'s quantizers.
"""

from __future__ import annotations

import functools

import jax

from fp4jax import backends
from fp4jax_kernels.quantize import pallas_triton, reference
from fp4jax_kernels.quantize.spec import QuantizeSpec

IMPLEMENTATIONS = {"xla": reference.quantize, "pallas": pallas_triton.quantize}
PAIR_IMPLEMENTATIONS = {"xla": reference.quantize_pair, "pallas": pallas_triton.quantize_pair}


def quantize(x: jax.Array, spec: QuantizeSpec, key: jax.Array | None = None, *, signs: jax.Array | None = None,
             backend: str = "auto", interpret: bool | None = None):
  """``Quantized(qtensor, dequantized, trust_mask, global_scale)`` for ``spec`` (see ``pallas_triton.quantize``);
  identical bits from every backend.

  ``signs``: an explicit Hadamard sign vector for ``hadamard_signs="random"`` (instead of the draw from ``key``).
  ``interpret``: run the Pallas kernel in interpret mode; None picks it when the device is not a GPU.
  """
  n_axis_shape = x.shape[::-1] if spec.transposed else x.shape
  name = backends.resolve(backend, backends.quantize_backend(n_axis_shape, spec.unit))
  return _implementation(IMPLEMENTATIONS, "quantize", name, interpret)(x, spec, key, signs=signs)


def quantize_pair(x: jax.Array, rows: QuantizeSpec, cols: QuantizeSpec, rows_key: jax.Array | None = None,
                  cols_key: jax.Array | None = None, *, rows_signs: jax.Array | None = None,
                  cols_signs: jax.Array | None = None, backend: str = "auto", interpret: bool | None = None):
  """``(quantize(x, rows, rows_key, ...), quantize(x, cols, cols_key, ...))``, by ``pallas_triton.quantize_pair``
  (one pre-pass and one kernel for both) or the reference; identical bits from every backend. ``"auto"`` picks the
  kernel where it runs both directions (``backends.quantize_backend`` for each) and speeds them up
  (``pallas_triton.pair_pays``); ``"pallas"`` runs it wherever it takes them (``pallas_triton.pair_refusal``)."""
  on_kernel = {backends.quantize_backend(x.shape, rows.unit), backends.quantize_backend(x.shape[::-1], cols.unit)}
  name = backends.resolve(backend, "pallas" if on_kernel == {"pallas"} and pallas_triton.pair_pays(rows, cols)
                          else "xla")
  impl = _implementation(PAIR_IMPLEMENTATIONS, "quantize_pair", name, interpret)
  return impl(x, rows, cols, rows_key, cols_key, rows_signs=rows_signs, cols_signs=cols_signs)


def _implementation(table: dict, what: str, name: str, interpret: bool | None):
  """``table[name]``, the Pallas one with its interpret mode (None: when the device is not a GPU)."""
  if name not in table:
    raise ValueError(f"{what} has no {name!r} implementation; choose from {sorted(table)}")
  if name != "pallas":
    return table[name]
  return functools.partial(table[name], interpret=backends.pallas_interpret() if interpret is None else interpret)
