"""Pallas kernels beneath fp4jax's quantizers and dot (import name ``fp4jax_kernels``; folder ``kernels/``).

Importing the package registers its implementations of ``fp4jax.operand``'s ops as backend ``"pallas"`` in
``fp4jax.backends``' registry (``fp4jax_kernels.operand``). ``fp4jax`` never imports this package: its registry
imports it through the ``"fp4jax.backends"`` entry point (``pyproject.toml``) on the first call that asks for a
backend it has nothing registered for (``backend="pallas"``, or ``"auto"`` on a GPU that runs the kernels).
"""

from fp4jax_kernels import operand as _operand

_operand.register()
