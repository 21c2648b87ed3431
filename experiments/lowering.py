"""JAX config values that a jitted step is traced and lowered under, and restored after.

Some JAX options change how a program lowers, not what it computes: ``jax_threefry_gpu_kernel_lowering`` turns each
threefry PRNG call of a GPU program from its 20 unrolled rounds into one kernel, the same bits
(``ModelConfig.jax_config``). Such options are part of ``jax.jit``'s cache key, so they must hold at every call of
the step, not once: :class:`Scoped` wraps a jitted function so that its calls, ``lower`` and ``trace`` (and the
traced program's ``lower``) run under them, leaving the process's values as they were.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax


@contextlib.contextmanager
def scoped(flags: Mapping[str, Any]) -> Iterator[None]:
  """Set the JAX config options ``flags`` (``{name: value}``, ``jax.config.update``) for the block.

  Args:
    flags: JAX config option names and their values.

  Raises:
    ValueError: a name that is not a JAX config option (the message names it), before any option is set.
  """
  unknown = [name for name in flags if not hasattr(jax.config, name)]
  if unknown:
    raise ValueError(f"{unknown[0]!r} is not a JAX config option")
  saved = {name: getattr(jax.config, name) for name in flags}
  try:
    for name, value in flags.items():
      jax.config.update(name, value)
    yield
  finally:
    for name, value in saved.items():
      jax.config.update(name, value)


class Scoped:
  """``fn`` (a jitted function, or what its ``trace`` returned) with its calls, ``lower`` and ``trace`` under
  ``flags`` (:func:`scoped`); other attributes are ``fn``'s.

  Args:
    fn: the jitted function.
    flags: JAX config option names and values.
  """

  def __init__(self, fn: Callable, flags: Mapping[str, Any]):
    self.fn = fn
    self.flags = dict(flags)

  def __call__(self, *args, **kwargs):
    with scoped(self.flags):
      return self.fn(*args, **kwargs)

  def lower(self, *args, **kwargs):
    with scoped(self.flags):
      return self.fn.lower(*args, **kwargs)

  def trace(self, *args, **kwargs) -> Scoped:
    """``fn.trace``, its result wrapped too: the traced program lowers under ``flags``."""
    with scoped(self.flags):
      return Scoped(self.fn.trace(*args, **kwargs), self.flags)

  def __getattr__(self, name: str):
    if name == "fn":  # not set yet (an instance made without __init__, as copy makes it): no recursion
      raise AttributeError(name)
    return getattr(self.fn, name)
