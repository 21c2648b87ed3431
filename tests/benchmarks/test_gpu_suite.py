"""benchmarks/gpu_suite.sh on the CPU: an unknown piece, flag set or model is refused with the names it takes."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _suite(piece: str, tmp_path, **env) -> subprocess.CompletedProcess:
  return subprocess.run(
    ["bash", "benchmarks/gpu_suite.sh", piece],
    cwd=REPO,
    env={**os.environ, "OUT": str(tmp_path), "SKIP_INSTALL": "1", "JAX_PLATFORMS": "cpu", **env},
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )


@pytest.mark.parametrize("piece", ["loop-flags", "loop-copies"])
def test_an_unknown_flag_set_is_refused_before_anything_runs(piece, tmp_path):
  proc = _suite(piece, tmp_path, FLAGSETS="none bogus")
  assert proc.returncode == 2
  sets = "none double_buffering region_analysis dynamic_slice_fusion no_command_buffer"
  assert f"unknown flag set 'bogus' ({sets})" in proc.stderr
  assert not list(tmp_path.glob("*none*"))  # refused before the first flag set ran: the sets are checked first


def test_an_unknown_piece_is_refused(tmp_path):
  proc = _suite("nope", tmp_path)
  assert proc.returncode == 2 and "usage: bash benchmarks/gpu_suite.sh PIECE" in proc.stderr


def test_the_unroll_piece_refuses_an_unknown_model_before_anything_runs(tmp_path):
  proc = _suite("unroll", tmp_path, MODEL="50M")
  assert proc.returncode == 2 and "gpu_suite.sh unroll: MODEL must be 30M or 125M, got '50M'" in proc.stderr
  assert not list(tmp_path.glob("train_throughput*"))
