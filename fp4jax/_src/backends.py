"""Which implementation runs an op: the one backend vocabulary, the registry of implementations, fallback.

Backends (``Backend``): ``"xla"`` (pure JAX, every device), ``"pallas"`` (``fp4jax_kernels``' Pallas Triton
kernels: a GPU of compute capability >= 8.0; Pallas interpret mode elsewhere), ``"native"`` (block-scaled FP4
tensor cores via ``jax.nn.scaled_matmul``: compute capability >= 10.0) and ``"auto"``, every public entry's
default: the implementations this device runs, fastest first (``candidates``), each taking the case or refusing it.

The registry is the one seam between the numerics and the kernels. An op (a name such as ``"quantize_operand"``)
has implementations registered by ``(op, backend)`` (``register``); ``run`` calls them in the fallback order of the
backend asked for. An implementation owns its limits: where it cannot take a case (a shape, a dtype, a format, a
size below which it does not pay) it raises ``Unsupported(reason)`` before computing anything, and ``run`` tries the
next one; any other error propagates. A backend named explicitly has no fallback: its refusal reaches the caller.

The core registers its XLA implementations itself and never imports the kernels. The kernels package registers
its implementations when it is imported (``import fp4jax_kernels``); ``run`` imports it on the first call that
needs a backend with nothing registered for the op, through the ``"fp4jax.backends"`` entry-point group
(``pyproject.toml``: ``pallas = "fp4jax_kernels"``), loaded once. ``"auto"`` on a device without a GPU asks for
``"xla"`` only, so there it never loads the kernels (nor runs them in interpret mode).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

import jax

Backend = Literal["auto", "xla", "pallas", "native"]
NATIVE_FP4_MIN_CAPABILITY = (10, 0)  # Blackwell (sm_100) and newer
PALLAS_MIN_CAPABILITY = (8, 0)  # Triton's bf16 tensor-core dot
ENTRY_POINT_GROUP = "fp4jax.backends"

_REGISTRY: dict[str, dict[str, Callable]] = {}
_plugins_loaded = False


class Unsupported(ValueError):
  """Raised by an implementation that cannot take a case (``str(error)`` says why); ``run`` then tries the next."""


# ------------------------------------------------------------------------------------------------ devices
def compute_capability(device: jax.Device | None = None) -> tuple[int, int] | None:
  """(major, minor) compute capability of an NVIDIA GPU device, None for any other device.

  Args:
    device: the device to inspect; None means ``jax.devices()[0]``.

  Returns:
    ``(major, minor)`` as two ints (e.g. ``(9, 0)`` for an H100), or None when ``device`` is not a GPU or reports no
    compute capability.
  """
  device = device or jax.devices()[0]
  if device.platform != "gpu" or not hasattr(device, "compute_capability"):
    return None
  major, minor = str(device.compute_capability).split(".")
  return int(major), int(minor)


def has_native_fp4(device: jax.Device | None = None) -> bool:
  """Whether native block-scaled FP4 GEMM (NVFP4 / MXFP4 tcgen05 MMA) exists: compute capability >= 10.0.

  Args:
    device: the device to inspect; None means ``jax.devices()[0]``.

  Returns:
    True for an NVIDIA GPU of compute capability >= 10.0, else False.
  """
  cc = compute_capability(device)
  return cc is not None and cc >= NATIVE_FP4_MIN_CAPABILITY


def has_pallas_triton(device: jax.Device | None = None) -> bool:
  """Whether the Pallas Triton kernels can run: an NVIDIA GPU of compute capability >= 8.0.

  Args:
    device: the device to inspect; None means ``jax.devices()[0]``.

  Returns:
    True for an NVIDIA GPU of compute capability >= 8.0, else False.
  """
  cc = compute_capability(device)
  return cc is not None and cc >= PALLAS_MIN_CAPABILITY


def pallas_interpret(device: jax.Device | None = None) -> bool:
  """Run Pallas kernels in interpret mode: the device is not a GPU (CPU CI; same jaxpr, same bits, slow)."""
  device = device or jax.devices()[0]
  return device.platform != "gpu"


# ------------------------------------------------------------------------------------------------ vocabulary
def check(backend: Any, where: str) -> Backend:
  """Validates a backend name.

  Args:
    backend: the value to check; must be one of ``Backend``'s names (``"auto"``, ``"xla"``, ``"pallas"``,
      ``"native"``).
    where: the caller's name, put at the start of the error message.

  Returns:
    ``backend`` itself.

  Raises:
    ValueError: ``backend`` is not one of ``Backend``'s names (the message names ``where`` and the allowed names).
  """
  if backend not in get_args(Backend):
    raise ValueError(f"{where}: backend must be one of {get_args(Backend)}, got {backend!r}")
  return backend


def candidates(backend: Backend, device: jax.Device | None = None) -> tuple[str, ...]:
  """The implementations to try, in order.

  For a named backend, ``(backend,)``; for ``"auto"``, those ``device`` runs, fastest first: ``"native"`` (compute
  capability >= 10.0), ``"pallas"`` (>= 8.0), then ``"xla"``.

  Args:
    backend: one of ``Backend``'s names (not validated here: see ``check``).
    device: the device to choose for (only used for ``"auto"``); None means ``jax.devices()[0]``.

  Returns:
    A non-empty tuple of backend names; for ``"auto"`` it always ends with ``"xla"``.
  """
  if backend != "auto":
    return (backend,)
  return (("native",) if has_native_fp4(device) else ()) + (("pallas",) if has_pallas_triton(device) else ()) + ("xla",)


# ------------------------------------------------------------------------------------------------ registry
def register(op: str, backend: str, impl: Callable) -> None:
  """Makes ``impl`` the ``backend`` implementation of ``op``, replacing any earlier one.

  Args:
    op: the op's name, e.g. ``"quantize_operand"``.
    backend: one of ``Backend``'s names other than ``"auto"``.
    impl: the implementation; it takes the op's arguments and raises ``Unsupported(reason)`` before computing
      anything for a case it cannot take.

  Returns:
    None.

  Raises:
    ValueError: ``backend`` is ``"auto"`` (a fallback order, not an implementation) or not one of ``Backend``'s names.
  """
  if backend == "auto":
    raise ValueError(f"register: {op!r} cannot register backend 'auto' (a fallback order, not an implementation)")
  check(backend, f"register({op!r})")
  _REGISTRY.setdefault(op, {})[backend] = impl


def unregister(op: str, backend: str) -> None:
  """Removes ``op``'s ``backend`` implementation, if any (no error when there is none).

  Args:
    op: the op's name.
    backend: the backend whose implementation to remove.

  Returns:
    None.
  """
  _REGISTRY.get(op, {}).pop(backend, None)


def implementation(op: str, backend: str) -> Callable | None:
  """``op``'s ``backend`` implementation, None where there is none (does not load plugins).

  Args:
    op: the op's name.
    backend: a backend name other than ``"auto"``.

  Returns:
    The registered callable, or None.
  """
  return _REGISTRY.get(op, {}).get(backend)


def fallback_order(op: str, backend: Backend) -> tuple[str, ...]:
  """The order in which to try an op whose XLA implementation takes every case: ``candidates(backend)``, then
  ``"xla"``, those with an implementation of ``op``. A named kernel backend thus falls back to XLA for such an op.
  Plugins are loaded only when a backend other than ``"xla"`` is among them (``"auto"`` on a CPU loads none).

  Args:
    op: the op's name.
    backend: one of ``Backend``'s names.

  Returns:
    The backend names to pass to ``run`` as ``order``.
  """
  wanted = tuple(dict.fromkeys(candidates(backend) + ("xla",)))
  if wanted != ("xla",):
    load_plugins()
  return tuple(name for name in wanted if name in _REGISTRY.get(op, {}))


def registered(op: str) -> tuple[str, ...]:
  """The backends with an implementation of ``op``.

  Args:
    op: the op's name.

  Returns:
    The backend names registered for ``op``, sorted (empty when there are none). Does not load plugins.
  """
  return tuple(sorted(_REGISTRY.get(op, {})))


def load_plugins() -> None:
  """Import, once, every module of the ``"fp4jax.backends"`` entry-point group (the kernels register themselves
  when imported)."""
  global _plugins_loaded
  if _plugins_loaded:
    return
  _plugins_loaded = True
  for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
    entry.load()


def run(op: str, backend: Backend, *args, order: Sequence[str] | None = None, **kwargs):
  """``op``'s result from the first implementation in ``candidates(backend)`` (or ``order``) that takes the case.

  Skipped: a backend with no implementation of ``op`` (after ``load_plugins``) under ``"auto"``, and an
  implementation that raises ``Unsupported``. Other errors propagate.

  Args:
    op: the op's name.
    backend: one of ``Backend``'s names; a named backend has no fallback.
    *args: positional arguments passed to the implementation.
    order: the backend names to try, in order, instead of ``candidates(backend)``.
    **kwargs: keyword arguments passed to the implementation.

  Returns:
    Whatever the first implementation that takes the case returns.

  Raises:
    ValueError: ``backend`` is not ``"auto"`` and a backend in the order has no implementation of ``op``.
    Unsupported: every implementation tried refused the case (the message names the op and every reason).
  """
  order = tuple(order or candidates(backend))
  impls = _REGISTRY.get(op, {})
  if any(name not in impls for name in order):
    load_plugins()
  reasons = []
  for name in order:
    impl = impls.get(name)
    if impl is None:
      if backend != "auto":
        raise ValueError(
          f"backend={backend!r}: {op} has no {name!r} implementation (registered: {registered(op)}); "
          f"the kernels register theirs when fp4jax_kernels is imported"
        )
      continue
    try:
      return impl(*args, **kwargs)
    except Unsupported as refusal:
      reasons.append(f"{name}: {refusal}")
  hint = "" if backend == "auto" else "; backend='auto' falls back to the next implementation"
  raise Unsupported(f"backend={backend!r}: no implementation of {op} takes this case ({'; '.join(reasons)}){hint}")
