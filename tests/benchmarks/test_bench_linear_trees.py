"""benchmarks/linear_trees.py: its arguments are checked before any tree runs (no GPU needed)."""

import pytest

from benchmarks import linear_trees


@pytest.mark.parametrize(
  ("extra", "match"),
  [
    (["--rounds", "0"], "--rounds must be at least 1, got 0"),
    ([], "expected a folder holding another commit's benchmarks/bench_linear.py"),
  ],
)
def test_bad_arguments_are_refused_naming_the_flag(tmp_path, extra, match, capsys):
  with pytest.raises(SystemExit):
    linear_trees.main(["--baseline", str(tmp_path), *extra])
  assert match in capsys.readouterr().err
