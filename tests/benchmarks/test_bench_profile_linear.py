"""benchmarks/profile_linear.py: its document on the CPU (no device kernels there) and the report's table of it."""

import importlib
import json
import pathlib

import pytest

from benchmarks import report


@pytest.fixture
def profile_linear(monkeypatch):
  """The script as its command line imports it: its siblings (bench_linear, benchtools) on sys.path."""
  monkeypatch.syspath_prepend(str(pathlib.Path(report.__file__).parent))
  return importlib.import_module("profile_linear")


# slow tier; default representative: test_report_renders_busy_time_per_step_and_the_top_kernel (its document's table)
@pytest.mark.slow
def test_cpu_run_writes_a_document_with_every_recipe(tmp_path, profile_linear):
  out = tmp_path / "p.json"
  profile_linear.main(
    ["--recipes", "bf16,nvfp4_rtn", "--backend", "xla", "--shape", "32,32,16", "--steps", "1", "--json", str(out)]
  )
  doc = json.loads(out.read_text())
  assert doc["benchmark"] == "profile_linear" and doc["shape"] == [32, 32, 16] and doc["steps"] == 1
  assert set(doc["recipes"]) == {"bf16", "nvfp4_rtn"}  # no "/device:" process on the CPU: empty summaries


def test_report_renders_busy_time_per_step_and_the_top_kernel():
  summary = {"busy_ms_per_step": 1.5, "kernels_per_step": 23.0, "top": [["gemm_fusion_dot", 14.0, 40]]}
  doc = {
    "benchmark": "profile_linear",
    "header": "device: X",
    "commit": "abc",
    "command": "cmd",
    "shape": [8, 4, 2],
    "backend": "auto",
    "steps": 20,
    "recipes": {"nvfp4_rtn": {"/device:GPU:0": summary}},
  }
  lines = report.RENDER["profile_linear"](doc)
  assert "| nvfp4_rtn | 1.500 | 23 | gemm_fusion_dot (0.700) |" in lines
  assert any("8x4 x (2x4)ᵀ, backend auto" in line for line in lines)
