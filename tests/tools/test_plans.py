"""Every committed lease plan (tools/plans/*.txt) is a plan `tools/lease_sweeps.sh` can start: each line a unique
name and fp4jax-sweep arguments that parse and give runs, so that a typo is found here and not on a lent GPU."""

import shlex
from pathlib import Path

import pytest

from fp4jax_experiments import sweep, train

PLANS = sorted((Path(__file__).resolve().parents[2] / "tools" / "plans").glob("*.txt"))


def plan_lines(text: str) -> list[tuple[str, list[str]]]:
  """``(name, arguments)`` per plan line as lease_sweeps.sh reads them: # comments and blank lines skipped, a
  trailing backslash continuing the line."""
  lines, current = [], ""
  for raw in text.splitlines():
    if not current and (not raw.strip() or raw.lstrip().startswith("#")):
      continue
    current += raw.rstrip()
    if current.endswith("\\"):
      current = current[:-1] + " "
      continue
    name, *args = shlex.split(current)
    lines.append((name, args))
    current = ""
  return lines


def test_plan_lines_join_continued_lines_and_skip_comments():
  text = "# a comment\n\nm30 --sizes 30M \\\n  --ratios 10\nq --sizes 1M\n"
  assert plan_lines(text) == [("m30", ["--sizes", "30M", "--ratios", "10"]), ("q", ["--sizes", "1M"])]


@pytest.mark.parametrize("path", PLANS, ids=[p.name for p in PLANS])
def test_every_plan_line_is_a_sweep_that_plans_runs(path, tmp_path):
  lines = plan_lines(path.read_text())
  assert lines, f"{path.name}: no plan lines"
  names = [name for name, _ in lines]
  assert len(set(names)) == len(names), f"{path.name}: repeated names {names}"
  for name, args in lines:
    reserved = {"--out", "--max-minutes", "--results", "--eval-results"} & set(args)
    assert not reserved, f"{path.name}, {name}: lease_sweeps.sh sets {sorted(reserved)} itself"
    parsed = sweep.build_parser().parse_args([*args, "--out", str(tmp_path / name)])
    runs = sweep.plan(train.config_from_args(parsed), parsed.sizes, parsed.ratios, parsed.recipes, parsed.seeds)
    assert runs, f"{path.name}, {name}: no runs"
