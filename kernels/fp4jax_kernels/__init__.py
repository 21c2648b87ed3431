"""Pallas kernels beneath fp4jax's quantizers, dot and packed matmul (import name ``fp4jax_kernels``; folder
``kernels/``).

Importing the package registers its implementations in ``fp4jax.backends``' registry: of ``fp4jax.operand``'s
quantizer ops as backend ``"pallas"`` (``fp4jax_kernels.operand``), of ``fp4jax.estimators.SELECT_OP`` (OCC's
per-row select) as ``"pallas"`` (``fp4jax_kernels.select.api``), of ``fp4jax._src.operand.INVERSE_ROTATE_OP`` (the
backward's inverse Hadamard) as ``"pallas"`` (``fp4jax_kernels.rotate.api``) and of
``fp4jax.matmul.PACKED_MATMUL_OP`` as ``"pallas"`` and ``"native"`` (``fp4jax_kernels.gemm.api``). ``fp4jax`` never
imports this package: its registry imports it through the ``"fp4jax.backends"`` entry point (``pyproject.toml``) on
the first call that asks for a backend it has nothing registered for (a named kernel backend, or ``"auto"`` on a GPU
that runs the kernels). ``fp4jax_kernels.contrib`` holds a measured, experimental kernel that the library does not
call.
"""

from fp4jax_kernels import operand as _operand
from fp4jax_kernels.gemm import api as _gemm_api
from fp4jax_kernels.rotate import api as _rotate_api
from fp4jax_kernels.select import api as _select_api

_operand.register()
_select_api.register()
_rotate_api.register()
_gemm_api.register()
