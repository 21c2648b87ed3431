"""The public API: what the public modules' ``__all__`` list exists, comes from fp4jax, and every public function has
a Google-style docstring (``Args:`` naming each parameter, ``Returns:``).

The public modules are ``fp4jax``, ``fp4jax.flax`` and every module file beside them (``fp4jax/*.py``,
``fp4jax/flax/*.py``, no leading underscore), found on disk so that a new module is checked too.
"""

import importlib
import inspect
import pathlib
import re
import typing

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "fp4jax"

# Public functions (by the implementation's module and qualname) whose docstrings still lack sections: they live in
# fp4jax/_src/{quantize,recipes,dot}.py, which were being rewritten when the others were documented. The test skips
# them (naming what is missing) and fails once one is complete, so that it is taken out of this set.
TODO_INTEGRATOR: set[str] = set()

_SECTION = re.compile(r"^(Args|Arguments|Returns|Yields|Raises|Examples?|Notes?|Attributes):\s*$")
_ENTRY = re.compile(r"^  (\*{0,2}\w+(?:, \*{0,2}\w+)*)(?: \([^)]*\))?:")


def _module_names() -> list[str]:
  names = ["fp4jax", "fp4jax.flax"]
  for package, folder in (("fp4jax", ROOT), ("fp4jax.flax", ROOT / "flax")):
    names += sorted(f"{package}.{p.stem}" for p in folder.glob("*.py") if not p.stem.startswith("_"))
  return names


MODULES = _module_names()


def _public_items():
  """(public name, object) for every name in every public module's ``__all__``."""
  for module_name in MODULES:
    module = importlib.import_module(module_name)
    for name in getattr(module, "__all__", ()):
      yield f"{module_name}.{name}", getattr(module, name, None)


def _is_typing_alias(obj) -> bool:
  return typing.get_origin(obj) is not None


def _is_function(obj) -> bool:
  """A plain function, or a wrapper of one (``jax.custom_vjp``, ``functools.wraps``); not a class or module."""
  return not inspect.isclass(obj) and inspect.isfunction(inspect.unwrap(obj))


def _implementation_name(obj) -> str:
  fn = inspect.unwrap(obj)
  return f"{fn.__module__}.{fn.__qualname__}"


def _public_functions() -> dict[str, object]:
  """{implementation name: function} of the public functions (a function re-exported twice counts once)."""
  return {_implementation_name(obj): obj for _, obj in _public_items() if _is_function(obj)}


def _sections(doc: str) -> dict[str, list[str]]:
  """{section header: its lines} of a cleaned (``inspect.getdoc``) docstring."""
  sections, current = {}, None
  for line in doc.splitlines():
    header = _SECTION.match(line)
    if header:
      current = sections.setdefault(header.group(1), [])
    elif current is not None and line and not line.startswith(" "):
      current = None  # text back at the margin ends a section
    elif current is not None:
      current.append(line)
  return sections


def _documented_args(lines: list[str]) -> set[str]:
  names = set()
  for line in lines:
    entry = _ENTRY.match(line)
    if entry:
      names |= {name.lstrip("*") for name in entry.group(1).split(", ")}
  return names


def docstring_problems(fn) -> list[str]:
  """What ``fn``'s docstring lacks: an ``Args:`` section (when it has parameters) with an entry for every
  parameter and none for a name that is not one, and a ``Returns:`` (or ``Yields:``) section."""
  doc = inspect.getdoc(fn) or ""
  sections = _sections(doc)
  params = set(inspect.signature(fn).parameters)
  problems = []
  if params and "Args" not in sections:
    problems.append("no Args: section")
  elif params:
    documented = _documented_args(sections["Args"])
    if params - documented:
      problems.append(f"Args: does not document {sorted(params - documented)}")
    if documented - params:
      problems.append(f"Args: documents {sorted(documented - params)}, which are not parameters")
  if "Returns" not in sections and "Yields" not in sections:
    problems.append("no Returns: section")
  return problems


def test_public_modules_found():
  assert {"fp4jax.recipes", "fp4jax.rounding", "fp4jax.flax.linen", "fp4jax.flax.export"} <= set(MODULES)


@pytest.mark.parametrize("module_name", MODULES)
def test_all_lists_existing_public_names(module_name):
  module = importlib.import_module(module_name)
  names = getattr(module, "__all__", None)
  assert names, f"{module_name} has no __all__"
  assert [n for n in names if not hasattr(module, n)] == [], f"{module_name}.__all__ names missing attributes"
  assert [n for n in names if n.startswith("_")] == [], f"{module_name}.__all__ lists private names"
  assert len(set(names)) == len(names), f"{module_name}.__all__ lists a name twice"


def test_public_names_come_from_fp4jax():
  """Every public module, class and function is fp4jax's own (typing aliases and data constants excepted): no
  third-party object is re-exported as part of the API."""
  foreign = []
  for public, obj in _public_items():
    if _is_typing_alias(obj):
      continue
    if inspect.ismodule(obj):
      origin = obj.__name__
    elif inspect.isclass(obj) or callable(obj):
      origin = getattr(inspect.unwrap(obj), "__module__", None) or ""
    else:
      continue  # a constant (a format instance, a tuple, an array): its value is the API, not where it was defined
    if origin != "fp4jax" and not origin.startswith("fp4jax."):
      foreign.append(f"{public} -> {origin}")
  assert foreign == []


def test_todo_integrator_names_public_functions():
  assert TODO_INTEGRATOR - set(_public_functions()) == set()


@pytest.mark.parametrize("name", sorted(_public_functions()))
def test_public_function_docstring_has_args_and_returns(name):
  problems = docstring_problems(_public_functions()[name])
  if name in TODO_INTEGRATOR:
    assert problems, f"{name}'s docstring is complete: remove it from TODO_INTEGRATOR"
    pytest.skip(f"TODO_INTEGRATOR: {name}: {'; '.join(problems)}")
  assert problems == [], f"{name}: {'; '.join(problems)}"


def test_docstring_checker_finds_missing_sections():
  """The checker itself: a docstring without sections, with a parameter left out or a stale one, fails."""

  def bare(x, *, y=1):
    """Summary only."""

  def partial(x, *args, **kwargs):
    """Summary.

    Args:
      x: first.
      *args: more.
      stale: no longer a parameter.

    Returns:
      Nothing useful.
    """

  def complete(x, *args, **kwargs):
    """Summary.

    Args:
      x (int): first.
      *args, **kwargs: passed on.

    Returns:
      None.
    """

  assert docstring_problems(bare) == ["no Args: section", "no Returns: section"]
  assert docstring_problems(partial) == [
    "Args: does not document ['kwargs']",
    "Args: documents ['stale'], which are not parameters",
  ]
  assert docstring_problems(complete) == []
