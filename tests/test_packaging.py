"""Packaging: every installed top-level name starts with ``fp4jax``, the package list is the source tree's, and every
command of ``[project.scripts]`` is a ``main(argv=None)`` of the experiments' modules (pyproject.toml)."""

import ast
import importlib
import importlib.metadata
import inspect
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())
SETUPTOOLS = CONFIG["tool"]["setuptools"]
SCRIPTS = CONFIG["project"]["scripts"]


def _source_folder(package: str) -> Path:
  """The folder ``package`` is built from: its longest prefix in ``package-dir``, else the repository root."""
  parts = package.split(".")
  for n in range(len(parts), 0, -1):
    root = SETUPTOOLS.get("package-dir", {}).get(".".join(parts[:n]))
    if root is not None:
      return REPO / root / Path(*parts[n:])
  return REPO / Path(*parts)


def _tree_packages() -> set[str]:
  """Every folder with an ``__init__.py`` under the listed top-level packages' folders, as a dotted name."""
  found = set()
  for top in {p.split(".")[0] for p in SETUPTOOLS["packages"]}:
    root = _source_folder(top)
    found |= {".".join((top, *init.parent.relative_to(root).parts)) for init in root.rglob("__init__.py")}
  return found


def _modules_with_a_command_line() -> set[str]:
  """The modules of experiments/ that run as ``python -m``: an ``if __name__ == "__main__":`` block."""

  def runs_as_main(path: Path) -> bool:
    return any(
      isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in ast.parse(path.read_text()).body
    )

  return {path.stem for path in (REPO / "experiments").glob("*.py") if runs_as_main(path)}


def test_every_top_level_package_starts_with_fp4jax():
  tops = {p.split(".")[0] for p in SETUPTOOLS["packages"]}
  assert tops == {"fp4jax", "fp4jax_kernels", "fp4jax_experiments"}
  assert _source_folder("fp4jax_experiments") == REPO / "experiments"


def test_package_list_is_every_package_folder_of_the_tree():
  """The explicit list (needed to install experiments/ under another name) misses no subpackage: a folder with an
  ``__init__.py`` left out would be silently absent from the wheel."""
  for package in SETUPTOOLS["packages"]:
    assert (_source_folder(package) / "__init__.py").is_file(), package
  assert set(SETUPTOOLS["packages"]) == _tree_packages()


def test_every_command_line_module_has_its_console_script():
  expected = {
    f"fp4jax-{module.replace('_', '-')}": f"fp4jax_experiments.{module}:main"
    for module in _modules_with_a_command_line()
  }
  assert {"fp4jax-train", "fp4jax-sweep", "fp4jax-evaluate"} <= expected.keys()
  assert SCRIPTS == expected


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_console_script_resolves_to_a_main_taking_argv(script):
  module, attr = SCRIPTS[script].split(":")
  main = getattr(importlib.import_module(module), attr)
  assert callable(main)
  parameters = list(inspect.signature(main).parameters.values())
  assert [(p.name, p.default) for p in parameters] == [("argv", None)]


# The console script's path: import the module (its __name__ is not "__main__"), then call main. The measurement and
# the GEMM rate are stubbed: what is checked is how many host devices --smoke gets.
SMOKE = """
import jax
from fp4jax_experiments import bench_scaling
bench_scaling.matmul_tflops = lambda size: 1.0
bench_scaling.measure = lambda recipe, model, n, mesh, *rest: {
    "recipe": recipe, "mesh": mesh, "devices": n, "tokens_per_s": 1.0, "compile_s": 0.0, "visible": jax.device_count()}
bench_scaling.main(["--smoke"])
"""


def test_bench_scaling_smoke_gets_two_host_devices_as_a_console_script():
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(
    [sys.executable, "-c", SMOKE], env=env, capture_output=True, text=True, timeout=120, check=False
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  assert [(r["devices"], r["visible"]) for r in records] == [(1, 2), (2, 2)] * 2


def _setuptools_major() -> int:
  try:
    return int(importlib.metadata.version("setuptools").split(".")[0])
  except importlib.metadata.PackageNotFoundError:
    return 0


@pytest.mark.skipif(_setuptools_major() < 77, reason="building offline needs setuptools >= 77 (PEP 639 license)")
def test_wheel_holds_only_fp4jax_names_and_the_console_scripts(tmp_path):
  """The wheel itself, built offline (no index, no isolation) from a copy of the sources."""
  src = tmp_path / "src"
  ignore = shutil.ignore_patterns("__pycache__", "results")
  for folder in ("fp4jax", "kernels", "experiments"):
    shutil.copytree(REPO / folder, src / folder, ignore=ignore)
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(REPO / name, src / name)
  subprocess.run(
    [
      sys.executable,
      "-m",
      "pip",
      "wheel",
      "-q",
      "--no-deps",
      "--no-build-isolation",
      "--no-index",
      "-w",
      str(tmp_path / "whl"),
      str(src),
    ],
    check=True,
    capture_output=True,
    timeout=120,
  )
  [wheel] = (tmp_path / "whl").glob("*.whl")
  names = zipfile.ZipFile(wheel).namelist()
  assert {n.split("/")[0] for n in names} == {
    "fp4jax",
    "fp4jax_kernels",
    "fp4jax_experiments",
    f"fp4jax-{CONFIG['project']['version']}.dist-info",
  }
  assert "fp4jax_experiments/train.py" in names and "fp4jax_kernels/gemm/__init__.py" in names
  [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
  text = zipfile.ZipFile(wheel).read(entry_points).decode()
  assert all(f"{script} = {target}" in text for script, target in SCRIPTS.items())


def test_no_import_cycle_between_any_two_modules():
  """No two modules of fp4jax, fp4jax_kernels and fp4jax_experiments import each other, directly or through others,
  imports inside functions included (grimp's graph; the layer contracts in pyproject.toml are lint-imports')."""
  grimp = pytest.importorskip("grimp")  # installed with import-linter (the "lint" extra)
  graph = grimp.build_graph("fp4jax", "fp4jax_kernels", "fp4jax_experiments")
  cycles = []
  for module in sorted(graph.modules):
    for imported in graph.find_modules_directly_imported_by(module):
      if imported != module and graph.chain_exists(importer=imported, imported=module):
        cycles.append((module, imported))
  assert cycles == []
