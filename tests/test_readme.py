"""The README's Python examples run as written (in order, sharing one namespace)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _blocks():
  return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
  assert len(_blocks()) >= 2


def test_readme_examples_run():
  pytest.importorskip("orbax.checkpoint")
  namespace: dict = {}
  for block in _blocks():
    exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 — our own documentation
  assert namespace["y"].shape == (256, 256) and namespace["out"].shape == (256, 16)
