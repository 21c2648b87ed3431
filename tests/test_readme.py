"""The README's Python examples run as written (in order, sharing one namespace)."""

import pathlib
import re

import jax.numpy as jnp
import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _blocks():
  return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
  """At least two examples, each valid Python (running them, two training loops, is the slow test below)."""
  blocks = _blocks()
  assert len(blocks) >= 2
  for block in blocks:
    compile(block, str(README), "exec")


# slow tier; default representative: an integration run (two training loops); its parts: test_public_variants.py
# (quantize, dot_general, the linen and NNX layers) and tests/flax/ (training, packing); test_readme_has_examples
@pytest.mark.slow
def test_readme_examples_run():
  pytest.importorskip("orbax.checkpoint")
  namespace: dict = {}
  for block in _blocks():
    exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 — our own documentation
  assert namespace["out"].shape == (1024, 512) and namespace["dw"].shape == (512, 1024)
  # both training loops ran their jitted steps and the evaluation forward
  assert namespace["y_eval"].shape == (64, 16) and bool(jnp.isfinite(namespace["loss"]))
  assert bool(jnp.isfinite(namespace["nnx_loss"])) and namespace["model"].layers[0].dot_general.deterministic


def test_readme_layout_names_every_core_module_and_existing_folders():
  """The Layout section matches the tree: every module of fp4jax/_src (and fp4jax/_src/flax) is named in it, and
  every folder and file it names exists."""
  block = re.search(r"## Layout\n.*?```\n(.*?)```", README.read_text(), flags=re.S).group(1)
  repo = README.parent
  words = set(re.findall(r"\w+", block))
  modules = {p.stem for p in (repo / "fp4jax" / "_src").rglob("*.py") if p.stem != "__init__"}
  assert modules - words == set()
  paths = re.findall(r"(?<![\w/.])([\w.]+/(?:[\w.]+/)*[\w.]*)", block)
  bases = (repo, repo / "fp4jax" / "_src", repo / "kernels" / "fp4jax_kernels")  # the block's indented folders
  missing = [p for p in paths if not any((base / p).exists() for base in bases)]
  assert len(paths) > 8 and missing == []
