"""benchmarks/benchtools.py: the commit a result document names."""

import subprocess
from pathlib import Path

from benchmarks import benchtools
from fp4jax_experiments import train


def test_commit_is_the_variable_else_the_checkouts_head_marked_dirty_else_unknown(monkeypatch, tmp_path):
  """$FP4JAX_COMMIT wins; without it a tree whose files differ from its .git's HEAD (a copy under a stale .git, as a
  GPU machine's can be) is named HEAD-dirty (git's own rev-parse as the oracle), never HEAD alone; no git: unknown."""
  monkeypatch.setenv("FP4JAX_COMMIT", "abc1234")
  assert benchtools.commit() == "abc1234"
  monkeypatch.delenv("FP4JAX_COMMIT")
  git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
  subprocess.run([*git, "init", "-q"], check=True)
  (tmp_path / "f.py").write_text("a = 1\n")
  subprocess.run([*git, "add", "f.py"], check=True)
  subprocess.run([*git, "commit", "-qm", "one"], check=True)
  head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
  monkeypatch.setattr(train.data, "REPO_ROOT", tmp_path)
  assert benchtools.commit() == head.stdout.strip()
  (tmp_path / "f.py").write_text("a = 2\n")  # the tree moved on, its .git did not
  assert benchtools.commit() == head.stdout.strip() + "-dirty"
  monkeypatch.setattr(train.data, "REPO_ROOT", Path("/nonexistent-checkout"))
  assert benchtools.commit() == "unknown"
