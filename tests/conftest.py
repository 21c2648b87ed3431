"""Fixtures shared by every test directory."""

import atexit
import fcntl
import gc
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _checkout_import_roots() -> list[str]:
  """The folders that make this checkout's ``fp4jax``, ``fp4jax_kernels`` and ``fp4jax_experiments`` the ones
  imported: the repository, ``kernels/`` and, unless ``fp4jax_experiments`` already resolves to this checkout's
  ``experiments/`` (``pip install -e .`` of it maps the folder to that name), a temporary folder holding one link,
  ``fp4jax_experiments -> experiments/`` (a plain checkout, or an environment where another checkout is installed).
  """
  roots = [str(REPO), str(REPO / "kernels")]
  spec = importlib.util.find_spec("fp4jax_experiments")
  if spec is None or Path(spec.origin).resolve() != REPO / "experiments" / "__init__.py":
    links = tempfile.mkdtemp(prefix="fp4jax-checkout-")
    atexit.register(shutil.rmtree, links, ignore_errors=True)
    os.symlink(REPO / "experiments", Path(links) / "fp4jax_experiments", target_is_directory=True)
    roots.insert(0, links)
  return roots


# One persistent XLA compilation cache for the test run, this process and its subprocesses: the many tests (and
# ``python -m fp4jax_experiments.train`` subprocesses: a run, its kill, its resume) that compile the same program pay
# for it once. Entries are keyed by the program, the flags and the JAX version, so a hit is the same executable.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(tempfile.gettempdir()) / f"fp4jax-tests-xla-{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

# On a machine without a CUDA plugin (CI's CPUs), XLA:CPU skips LLVM's expensive passes (the loop and SLP vectorizers,
# unrolling) for this process and the subprocesses that inherit the flags: compiling is most of the suite's time.
# XLA:CPU compiles without fast-math, so these passes may not reassociate or otherwise change a float result; the
# bit-exact oracle tests (test_oracles_*, test_quantize, test_ieee, test_four_over_six_te, ...) pass with and without
# it.
_CUDA = any(importlib.util.find_spec(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin"))
_CPU_FLAG = "--xla_llvm_disable_expensive_passes=true"
if not _CUDA and _CPU_FLAG.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), _CPU_FLAG]))

# This process and every subprocess of the tests (``python -m fp4jax_experiments.train``, scripts) import the checkout
# under test, whether it is installed or not.
_ROOTS = _checkout_import_roots()
sys.path[:0] = _ROOTS
os.environ["PYTHONPATH"] = os.pathsep.join([*_ROOTS, *filter(None, [os.environ.get("PYTHONPATH")])])

# Registers the kernels' "pallas" implementations in fp4jax.backends, as the "fp4jax.backends" entry point does for
# an installed fp4jax (a plain checkout has no such metadata).
import fp4jax_kernels  # noqa: E402, F401
import jax  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])  # if jax came in first
jax.config.update(
  "jax_persistent_cache_min_compile_time_secs", float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"])
)


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
  """After each test module, JAX's in-memory caches (traced, lowered and compiled programs) are dropped: an xdist
  worker runs many modules, and their executables otherwise accumulate until two workers outgrow the CI machine's
  memory. Programs compiled again later come from the persistent compilation cache on disk."""
  yield
  jax.clear_caches()
  gc.collect()


@pytest.fixture
def published_recipes_only():
  """After the test, the recipe registry holds the published recipes alone again: a recipe registered by the test,
  or by a "module:name" it resolved (an ablation, a composed recipe), would otherwise stay for the later tests of the
  same worker (tests/test_compose.py expects the published ones)."""
  from fp4jax import recipes  # noqa: PLC0415

  yield
  for name in recipes.names()[len(recipes.PUBLISHED) :]:
    recipes.unregister(name)


@pytest.fixture(scope="session")
def jaxpr_equations():
  """``jaxpr_equations(jaxpr)``: every equation of a ``Jaxpr`` and, depth first, of the jaxprs in its equations'
  parameters (jit, custom_vjp, pallas_call, ...)."""
  from fp4jax_kernels import triton_ir  # noqa: PLC0415  (the kernels package: only where a test asks for it)

  return triton_ir.jaxpr_equations


def _run_script(script: Path, xla_flags: str, timeout: float, args: tuple[str, ...]) -> str:
  env = {**os.environ, "XLA_FLAGS": xla_flags, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(
    [sys.executable, str(script), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def script_json(tmp_path_factory):
  """``script_json(script, xla_flags, timeout, args=())``: the JSON object on the last stdout line of ``python script
  *args``, run in the repository on the CPU with ``XLA_FLAGS=xla_flags`` and the checkout importable, computed once
  per test session and ``args``.

  Modules whose comparisons need more host devices than this process has run themselves as a script. Under
  ``pytest -n`` each xdist worker holding one of their tests would run that script again; instead the first worker
  runs it under an exclusive lock in the session's shared temporary folder and stores its output, and the others
  wait for the lock and read it. A failed run stores nothing, so the next worker runs it again and fails alike.
  """
  if "PYTEST_XDIST_WORKER" not in os.environ:
    return lambda script, xla_flags, timeout, args=(): json.loads(_run_script(script, xla_flags, timeout, args))
  shared = tmp_path_factory.getbasetemp().parent  # one folder per session, shared by its workers

  def run_once(script, xla_flags, timeout, args=()):
    digest = hashlib.sha256("\0".join(args).encode()).hexdigest()[:12]
    stored = shared / f"{Path(script).stem}-{digest}.json"
    with open(shared / f"{Path(script).stem}.lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      if not stored.exists():
        stored.write_text(_run_script(script, xla_flags, timeout, args))
    return json.loads(stored.read_text())

  return run_once


def _selected_params(request, name: str) -> list:
  seen = {}
  for item in request.session.items:
    spec = getattr(item, "callspec", None)
    uses = request.fixturename in getattr(item, "fixturenames", ())
    if getattr(item, "module", None) is request.module and uses and spec is not None and name in spec.params:
      seen[spec.params[name]] = None
  return list(seen)


@pytest.fixture(scope="session")
def selected_params():
  """``selected_params(request, name)``: the values of the parameter ``name`` among the tests of ``request``'s module
  that use ``request``'s fixture and that this session runs (after ``-m`` and ``-k``), in first-seen order. A module
  fixture that computes every case in one subprocess computes only these, so its slow cases' share runs under
  ``pytest -m slow``."""
  return _selected_params
