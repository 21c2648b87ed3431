"""Every committed lease plan (tools/plans/*.txt) is a plan `tools/lease_sweeps.sh` can start: each line a unique
name and fp4jax-sweep arguments that parse and give runs (or "!" and a command), so that a typo is found here and not
on a lent GPU."""

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from fp4jax_experiments import sweep, train

pytestmark = pytest.mark.usefixtures("published_recipes_only")  # planning an ablation plan registers its recipes

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
    if args[0] == "!":  # a command line (a GPU probe): lease_sweeps.sh runs it with bash
      assert len(args) > 1, f"{path.name}, {name}: an empty command"
      continue
    reserved = {"--out", "--max-minutes", "--results", "--eval-results"} & set(args)
    assert not reserved, f"{path.name}, {name}: lease_sweeps.sh sets {sorted(reserved)} itself"
    parsed = sweep.build_parser().parse_args([*args, "--out", str(tmp_path / name)])
    runs = sweep.plan(train.config_from_args(parsed), parsed.sizes, parsed.ratios, parsed.recipes, parsed.seeds)
    assert runs, f"{path.name}, {name}: no runs"


PLAN_DIR = Path(__file__).resolve().parents[2] / "tools" / "plans"
LIB = PLAN_DIR / "lease_lib.sh"  # sourced by the scripts: its lease_sweep adds the fixed settings
SCRIPTS = sorted(p for p in PLAN_DIR.glob("*.sh") if p != LIB)


def script_sweeps(text: str) -> list[list[str]]:
  """The sweep arguments of a plan script's ``fp4jax-sweep ARGS``, ``lease_sweep NAME ARGS`` and
  ``lease_sweep_if_time SECONDS NAME ARGS`` lines (tools/plans/lease_lib.sh), continued lines joined, with the
  options whose value is a shell expansion (``--out "$LEASE_STATE/..."``) and the redirections dropped; a
  ``lease_sweep`` call passing its function's own arguments on (``"$@"``, in lease_lib.sh) is none."""
  joined = text.replace("\\\n", " ")
  sweeps = []
  skip = {"fp4jax-sweep": 1, "lease_sweep": 2, "lease_sweep_if_time": 3}
  for line in joined.splitlines():
    head = line.lstrip().split(" ", 1)[0]
    if head not in skip or line.rstrip().endswith("{") or (head != "fp4jax-sweep" and '"$@"' in line):
      continue
    words = shlex.split(line.split(">", 1)[0], posix=True)[skip[head] :]
    if head != "fp4jax-sweep":
      words += lib_settings()
    keep = []
    for i, word in enumerate(words):
      if "$" in word or (word.startswith("--") and i + 1 < len(words) and "$" in words[i + 1]):
        continue
      keep.append(word)
    sweeps.append(keep)
  return sweeps


def lib_settings() -> list[str]:
  """The fixed fp4jax-sweep settings that lease_lib.sh's lease_sweep adds to its arguments."""
  (settings,) = script_sweeps(LIB.read_text())
  return settings


def test_lease_sweep_lines_take_the_libs_settings():
  assert lib_settings()[:2] == ["--data", "linux"] and "--final-eval-batches" in lib_settings()
  (args,) = script_sweeps("lease_sweep q --sizes 10M --seeds 2 --devices 0\n")
  assert args == ["--sizes", "10M", "--seeds", "2", "--devices", "0", *lib_settings()]
  (args,) = script_sweeps("lease_sweep_if_time 540 q --sizes 50M --seeds 1\n")
  assert args == ["--sizes", "50M", "--seeds", "1", *lib_settings()]


SUITE = PLAN_DIR.parents[1] / "benchmarks" / "gpu_suite.sh"


def suite_pieces(text: str) -> list[str]:
  """The ``benchmarks/gpu_suite.sh PIECE`` calls of a plan script."""
  return re.findall(r"gpu_suite\.sh\s+([\w-]+)", text)


def test_suite_pieces_are_found_in_a_script():
  assert suite_pieces("X=1 bash benchmarks/gpu_suite.sh defaults\nbash benchmarks/gpu_suite.sh loop-copies &&") == [
    "defaults",
    "loop-copies",
  ]


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_sweep_and_suite_piece_of_a_plan_script_exists(path, tmp_path):
  text = path.read_text()
  sweeps, pieces = script_sweeps(text), suite_pieces(text)
  assert sweeps or pieces, f"{path.name}: no fp4jax-sweep and no gpu_suite.sh piece"
  labels = set(re.findall(r"^  ([\w-]+)\)$", SUITE.read_text(), re.MULTILINE))
  assert set(pieces) <= labels, f"{path.name}: gpu_suite.sh has no piece {sorted(set(pieces) - labels)}"
  for args in sweeps:
    parsed = sweep.build_parser().parse_args([*args, "--out", str(tmp_path / "s")])
    assert sweep.plan(train.config_from_args(parsed), parsed.sizes, parsed.ratios, parsed.recipes, parsed.seeds)


def test_a_plan_script_refuses_an_unknown_gpu_share():
  script = PLAN_DIR / "issue34-b.sh"
  proc = subprocess.run(["bash", str(script), "gpu9"], cwd=PLAN_DIR.parents[1], capture_output=True, text=True)
  assert proc.returncode == 2 and "say gpu0, gpu1, gpu2 or gpu3, got 'gpu9'" in proc.stderr
