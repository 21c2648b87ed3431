"""Fixtures shared by the experiments' tests."""

import pytest

from fp4jax_experiments import prepare


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """A small byte corpus with learnable structure (repeated sentences with counters)."""
  folder = tmp_path_factory.mktemp("corpus")
  text = "".join(f"line {i % 97}: the quick brown fox jumps over the lazy dog.\n" for i in range(3000))
  (folder / "text.txt").write_text(text)
  prepare.prepare_text(folder / "bytes", [folder / "text.txt"])
  return str(folder / "bytes")
