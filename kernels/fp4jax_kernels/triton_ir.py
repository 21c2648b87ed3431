"""The Triton IR of Pallas kernels, compiled offline for Hopper (sm_90) to count instructions: a developer's proxy.

``triton_modules`` captures the Triton IR that lowering a jitted function for CUDA produces (on any machine, no GPU),
``jaxpr_equations`` finds the ``pallas_call`` equations (grid, warps) of its trace;
``compile_sm90`` compiles one module with the ``triton`` package from PyPI (``pip install 'fp4jax[ptx]'``) into PTX
and a cubin; ``sass_histogram`` disassembles the cubin (``cuobjdump``, bundled with that package) and counts the
machine instructions by opcode. jaxlib compiles with its own bundled Triton, whose layout choices can differ, so
counts guide the work and only the GPU measures speed (a kernel with fewer PTX instructions can run slower).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile

import jax


def triton_modules(fn, *args) -> list[str]:
  """Triton IR (text) of every Pallas kernel that lowering ``fn(*args)`` for CUDA produces (works on CPU)."""
  from jax._src.pallas.triton import lowering  # noqa: PLC0415  (private: the IR is not exposed otherwise)

  modules, original = [], lowering.lower_jaxpr_to_triton_module

  def capture(*a, **kw):
    result = original(*a, **kw)
    modules.append(result.module.operation.get_asm())
    return result

  lowering.lower_jaxpr_to_triton_module = capture
  try:
    jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
  finally:
    lowering.lower_jaxpr_to_triton_module = original
  return modules


def jaxpr_equations(jaxpr):
  """Every equation of a ``Jaxpr`` and, depth first, of the jaxprs in its equations' parameters (jit, custom_vjp,
  pallas_call, ...): where a traced function's ``pallas_call`` equations are found, with their grid and warps."""
  for eqn, _ in counted_equations(jaxpr):
    yield eqn


def counted_equations(jaxpr, times: int = 1):
  """``(equation, runs per run of jaxpr)`` for ``jaxpr_equations``' equations: a scan's body runs ``length`` times
  (a layer loop's kernels launch once per iteration)."""
  for eqn in jaxpr.eqns:
    yield eqn, times
    inner_times = times * eqn.params["length"] if eqn.primitive.name == "scan" else times
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr, or a Jaxpr
        if hasattr(inner, "eqns"):
          yield from counted_equations(inner, inner_times)


def _triton():
  try:
    import triton  # noqa: PLC0415  (optional: pip install 'fp4jax[ptx]')
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
  except ImportError as e:
    raise ImportError("instruction counts need the triton package from PyPI: pip install 'fp4jax[ptx]'") from e
  return triton, GPUTarget


def compile_sm90(module: str, num_warps: int, num_stages: int = 1):
  """PyPI Triton's compilation of one captured module for sm_90 (``.asm`` has "ttgir", "ptx", "cubin").

  Compiling from a ``.ttir`` file skips Triton's TTIR passes (canonicalize, combine, CSE), which jaxlib's pipeline
  runs (the combine pass turns ``acc + dot(a, b)`` into ``dot(a, b, acc)``), so they run here first."""
  triton, target = _triton()
  from triton.backends.nvidia.compiler import CUDABackend  # noqa: PLC0415

  add_stages = CUDABackend.add_stages

  def with_ttir_passes(self, stages, options, *args):
    add_stages(self, stages, options, *args)
    to_ttgir = stages["ttgir"]
    stages["ttgir"] = lambda mod, metadata: to_ttgir(CUDABackend.make_ttir(mod, metadata, options, 90), metadata)

  with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "kernel.ttir")
    with open(path, "w") as f:
      f.write(module[module.index("module") :])
    CUDABackend.add_stages = with_ttir_passes
    try:
      return triton.compile(
        path, target=target("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages}
      )
    finally:
      CUDABackend.add_stages = add_stages


def ptx_opcodes(compiled) -> list[str]:
  """The PTX instructions of a compiled kernel, in order (opcodes with their modifiers, predicates dropped)."""
  return [m.group(1) for m in re.finditer(r"^\s+(?:@!?%p\d+\s+)?([a-z][\w.]*)", compiled.asm["ptx"], re.MULTILINE)]


def sass_histogram(compiled) -> collections.Counter:
  """SASS instructions of a compiled kernel by opcode (``IMAD``, ``PRMT``, ``HMMA``...), from ``cuobjdump -sass``."""
  triton, _ = _triton()
  tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
  with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "kernel.cubin")
    with open(path, "wb") as f:
      f.write(compiled.asm["cubin"])
    sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
  ops = re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*)", sass, re.MULTILINE)
  return collections.Counter(ops)
