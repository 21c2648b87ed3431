"""tools/lease_sweeps.sh on the CPU: a plan line continued over three lines starts one sweep in its own session (and a
"!" line a command), a call copies the finished runs and the commands' output out, and a second call on the same
machine starts nothing and copies them again."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _call(plan: Path, out: Path, state: Path, cache: Path) -> subprocess.CompletedProcess:
  env = {
    **os.environ,
    "OUT": str(out),
    "LEASE_STATE": str(state),
    "SKIP_INSTALL": "1",  # the checkout is installed already
    "COMMIT": "abc1234",
    "FP4JAX_CACHE": str(cache),
    "JAX_PLATFORMS": "cpu",
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # fp4jax-sweep beside this python
  }
  return subprocess.run(
    ["bash", "tools/lease_sweeps.sh", str(plan), "4", "300"],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=400,
    check=False,
  )


def test_a_plan_runs_across_calls_and_its_results_come_out(tmp_path):
  plan = tmp_path / "plan.txt"
  plan.write_text(
    "# a comment, then one sweep over three lines\n"
    "\n"
    "tiny --sizes 100K --ratios 0.02 --recipes bf16 --seeds 3 \\\n"
    "  --data stdlib --seq-len 32 --batch-size 4 --eval-every 10 --eval-batches 2 \\\n"
    "  --log-every 10 --ckpt-every 1000 --final-eval-batches 2\n"
    'probe ! echo "$SKIP_INSTALL $((LEASE_DEADLINE - $(date +%s))) $LEASE_STATE" > "$OUT/probe.txt"\n'  # a command
  )
  out, state, cache = tmp_path / "out", tmp_path / "state", tmp_path / "cache"
  first = _call(plan, out, state, cache)
  assert first.returncode == 0, first.stdout + first.stderr
  assert "all sweeps exited" in first.stdout and "1/1 finished" in first.stdout
  (result,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
  assert (result["recipe"], result["seed"], result["status"], result["commit"]) == ("bf16", 3, "finished", "abc1234")
  (record,) = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
  assert record["name"] == result["name"] == "100K-r0.02-bf16-s3" and len(record["batch_losses"]) == 2
  device = (out / "device.txt").read_text()
  assert (
    device.count("started tiny: fp4jax-sweep --sizes 100K") == 1 and "--final-eval-batches 2 --max-minutes 4" in device
  )
  with tarfile.open(out / "runs.tgz") as tar:
    names = tar.getnames()
  assert "runs/tiny/100K-r0.02-bf16-s3/summary.json" in names and not any("/ckpt" in n for n in names)
  with tarfile.open(out / "commands.tgz") as tar:
    installed, left, lease_state = tar.extractfile("out/probe/probe.txt").read().decode().split()
  assert installed == "1" and 0 < int(left) <= 4 * 60 and lease_state == str(state)  # after the install, 4 minutes
  assert device.count("started probe: echo") == 1
  (out / "results.jsonl").unlink()
  second = _call(plan, out, state, cache)  # the same machine: nothing starts again, the results are copied again
  assert second.returncode == 0, second.stdout + second.stderr
  assert (out / "device.txt").read_text() == device  # not started again: its start time and lines unchanged
  assert json.loads((out / "results.jsonl").read_text())["name"] == "100K-r0.02-bf16-s3"


def test_a_missing_plan_or_a_bad_budget_is_refused_before_anything_starts(tmp_path):
  plan = tmp_path / "plan.txt"
  plan.write_text("tiny --sizes 100K --ratios 0.02 --recipes bf16\n")
  empty = tmp_path / "empty.txt"
  empty.write_text("tiny --sizes 100K --ratios 0.02 --recipes bf16\nprobe !\n")
  for args, message in (
    ([str(tmp_path / "none.txt"), "4"], "PLAN '" + str(tmp_path / "none.txt") + "' is not a file"),
    ([str(plan), "soon"], "MINUTES 'soon' and WAIT_S '540' must be numbers"),
    ([str(empty), "4"], "PLAN line 'probe !' has no command after '!'"),
  ):
    proc = subprocess.run(
      ["bash", "tools/lease_sweeps.sh", *args],
      cwd=REPO,
      env={**os.environ, "OUT": str(tmp_path / "out"), "LEASE_STATE": str(tmp_path / "state")},
      capture_output=True,
      text=True,
      timeout=60,
      check=False,
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "state").exists()
