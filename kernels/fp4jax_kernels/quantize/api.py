"""User entry for the fused quantize of a ``QuantizeSpec``: an implementation per device and shape, through
``fp4jax.backends``' registry (ops ``QUANTIZE_OP`` and ``PAIR_OP``, registered when this module is imported).

Each implementation has one signature, ``impl(x, spec, key, *, output, signs, interpret) -> Quantized`` (the pair's:
``quantize_pair``'s), and refuses what it cannot take with ``fp4jax.backends.Unsupported``; ``"auto"`` falls back
from the Pallas kernel to the reference. A Mosaic GPU kernel can be registered beside the Triton one without
touching callers. (``fp4jax.operand`` runs ``fp4jax_kernels.operand``'s implementations, not these.)
"""

from __future__ import annotations

import jax

from fp4jax._src import backends
from fp4jax._src.backends import Backend
from fp4jax._src.spec import QuantizeSpec
from fp4jax_kernels.quantize import output as output_lib
from fp4jax_kernels.quantize import pallas_triton, reference
from fp4jax_kernels.quantize.output import KernelOutput

QUANTIZE_OP = "fp4jax_kernels.quantize"
PAIR_OP = "fp4jax_kernels.quantize_pair"


def quantize(
  x: jax.Array,
  spec: QuantizeSpec,
  key: jax.Array | None = None,
  *,
  output: KernelOutput = KernelOutput(),  # noqa: B008 (frozen)
  signs: jax.Array | None = None,
  backend: Backend = "auto",
  interpret: bool | None = None,
):
  """``Quantized(qtensor, dequantized, trust_mask, global_scale)``: ``x`` quantized by the quantizer ``spec``
  (an ``fp4jax.QuantizeSpec``), written as ``output`` says (see ``pallas_triton.quantize``); identical bits from
  every backend.

  ``signs``: an explicit Hadamard sign vector for ``spec.signs="random"`` (instead of the draw from ``key``).
  ``interpret``: run the Pallas kernel in interpret mode; None picks it when the device is not a GPU.
  """
  backend = backends.check(backend, "fp4jax_kernels.quantize.api.quantize")
  output_lib.check(spec, output)
  return backends.run(
    QUANTIZE_OP, backend, x, spec, key, output=output, signs=signs, interpret=interpret, auto=backend == "auto"
  )


def quantize_pair(
  x: jax.Array,
  rows: QuantizeSpec,
  cols: QuantizeSpec,
  rows_key: jax.Array | None = None,
  cols_key: jax.Array | None = None,
  *,
  rows_output: KernelOutput,
  cols_output: KernelOutput,
  rows_signs: jax.Array | None = None,
  cols_signs: jax.Array | None = None,
  backend: Backend = "auto",
  interpret: bool | None = None,
):
  """``(quantize(x, rows, rows_key, output=rows_output, ...), quantize(x, cols, cols_key, output=cols_output,
  ...))``, by ``pallas_triton.quantize_pair`` (one pre-pass and one kernel for both) or the reference; identical
  bits from every backend. ``"auto"`` picks the kernel where it takes both directions and speeds them up
  (``pallas_triton.pair_pays``); ``"pallas"`` runs it wherever it takes them (``pallas_triton.pair_refusal``)."""
  backend = backends.check(backend, "fp4jax_kernels.quantize.api.quantize_pair")
  output_lib.check(rows, rows_output)
  output_lib.check(cols, cols_output)
  return backends.run(
    PAIR_OP,
    backend,
    x,
    rows,
    cols,
    rows_key,
    cols_key,
    rows_output=rows_output,
    cols_output=cols_output,
    rows_signs=rows_signs,
    cols_signs=cols_signs,
    interpret=interpret,
    auto=backend == "auto",
  )


def _whole_units(x: jax.Array, spec: QuantizeSpec, output: KernelOutput) -> None:
  """``Unsupported`` unless ``x`` is 2D with its quantized axis a whole number of ``output_lib.unit(spec)``."""
  n_axis_shape = x.shape[::-1] if output.transposed else x.shape
  unit = output_lib.unit(spec)
  if len(n_axis_shape) != 2 or n_axis_shape[-1] % unit:
    raise backends.Unsupported(
      f"the kernel quantizes 2D x whose quantized axis is whole {unit}-element units, "
      f"got shape {x.shape} along {output.along!r}"
    )


def _interpret(interpret: bool | None) -> bool:
  return backends.pallas_interpret() if interpret is None else interpret


def _kernel(x, spec: QuantizeSpec, key, *, output: KernelOutput, signs, interpret, auto: bool):
  """The Pallas kernel; under ``"auto"`` only for whole units (a named ``"pallas"`` leaves the checks to it)."""
  if auto:
    _whole_units(x, spec, output)
  return pallas_triton.quantize(x, spec, key, output=output, signs=signs, interpret=_interpret(interpret))


def _reference(x, spec: QuantizeSpec, key, *, output: KernelOutput, signs, interpret, auto: bool):
  del interpret, auto
  return reference.quantize(x, spec, key, output=output, signs=signs)


def _kernel_pair(x, rows: QuantizeSpec, cols: QuantizeSpec, rows_key, cols_key, *, interpret, auto: bool, **kw):
  """The fused pair; under ``"auto"`` only for whole units and a pair it speeds up (``pallas_triton.pair_pays``);
  a named ``"pallas"`` leaves the checks to it. ``kw``: ``rows_output``, ``cols_output``, ``rows_signs``,
  ``cols_signs``."""
  rows_output, cols_output = kw["rows_output"], kw["cols_output"]
  if auto:
    for spec, output in ((rows, rows_output), (cols, cols_output)):
      _whole_units(x, spec, output)
    if not pallas_triton.pair_pays(rows, cols, rows_output, cols_output):
      raise backends.Unsupported(
        f"quantize_pair: the kernel does not take or speed up rows ({rows}, {rows_output}) and cols "
        f"({cols}, {cols_output})"
      )
  return pallas_triton.quantize_pair(x, rows, cols, rows_key, cols_key, interpret=_interpret(interpret), **kw)


def _reference_pair(x, rows: QuantizeSpec, cols: QuantizeSpec, rows_key, cols_key, *, interpret, auto: bool, **kw):
  del interpret, auto
  return reference.quantize_pair(x, rows, cols, rows_key, cols_key, **kw)


backends.register(QUANTIZE_OP, "xla", _reference)
backends.register(QUANTIZE_OP, "pallas", _kernel)
backends.register(PAIR_OP, "xla", _reference_pair)
backends.register(PAIR_OP, "pallas", _kernel_pair)
