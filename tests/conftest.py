"""Fixtures shared by every test directory."""

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Registers the kernels' "pallas" implementations in fp4jax.backends, as the "fp4jax.backends" entry point does for
# an installed fp4jax (a checkout on PYTHONPATH, or an install older than the entry point, has no such metadata).
import fp4jax_kernels  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


def _equations(jaxpr):
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr, or a Jaxpr
        if hasattr(inner, "eqns"):
          yield from _equations(inner)


@pytest.fixture(scope="session")
def jaxpr_equations():
  """``jaxpr_equations(jaxpr)``: every equation of a ``Jaxpr`` and, depth first, of the jaxprs in its equations'
  parameters (jit, custom_vjp, pallas_call, ...)."""
  return _equations


def _run_script(script: Path, xla_flags: str, timeout: float) -> str:
  paths = [str(REPO), str(REPO / "kernels"), os.environ.get("PYTHONPATH", "")]
  env = {**os.environ, "XLA_FLAGS": xla_flags, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join(paths)}
  proc = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def script_json(tmp_path_factory):
  """``script_json(script, xla_flags, timeout)``: the JSON object on the last stdout line of ``python script``, run
  in the repository on the CPU with ``XLA_FLAGS=xla_flags`` and the repository and ``kernels/`` importable, computed
  once per test session.

  Modules whose comparisons need more host devices than this process has run themselves as a script. Under
  ``pytest -n`` each xdist worker holding one of their tests would run that script again; instead the first worker
  runs it under an exclusive lock in the session's shared temporary folder and stores its output, and the others
  wait for the lock and read it. A failed run stores nothing, so the next worker runs it again and fails alike.
  """
  if "PYTEST_XDIST_WORKER" not in os.environ:
    return lambda script, xla_flags, timeout: json.loads(_run_script(script, xla_flags, timeout))
  shared = tmp_path_factory.getbasetemp().parent  # one folder per session, shared by its workers

  def run_once(script, xla_flags, timeout):
    stored = shared / f"{Path(script).stem}.json"
    with open(shared / f"{Path(script).stem}.lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      if not stored.exists():
        stored.write_text(_run_script(script, xla_flags, timeout))
    return json.loads(stored.read_text())

  return run_once
