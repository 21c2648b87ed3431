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


def quantize(x: jax.Array, spec: QuantizeSpec, key: jax.Array | None = None, *, signs: jax.Array | None = None,
             backend: str = "auto", interpret: bool | None = None):
  """``Quantized(qtensor, dequantized, trust_mask, global_scale)`` for ``spec`` (see ``pallas_triton.quantize``);
  identical bits from every backend.

  ``signs``: an explicit Hadamard sign vector for ``hadamard_signs="random"`` (instead of the draw from ``key``).
  ``interpret``: run the Pallas kernel in interpret mode; None picks it when the device is not a GPU.
  """
  n_axis_shape = x.shape[::-1] if spec.transposed else x.shape
  name = backends.resolve(backend, backends.quantize_backend(n_axis_shape, spec.unit))
  if name not in IMPLEMENTATIONS:
    raise ValueError(f"quantize has no {name!r} implementation; choose from {sorted(IMPLEMENTATIONS)}")
  impl = IMPLEMENTATIONS[name]
  if name == "pallas":
    impl = functools.partial(impl, interpret=backends.pallas_interpret() if interpret is None else interpret)
  return impl(x, spec, key, signs=signs)
