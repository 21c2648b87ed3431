"""benchmarks/kernel_bounds.py: a step's Pallas launches counted through its layer loop, the profile's times merged
by kernel, the two limits per kernel from its launch records, and the report's table."""

import importlib
import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from benchmarks import report


@pytest.fixture
def kernel_bounds(monkeypatch):
  """The script as its command line imports it: its siblings (benchtools, kernels_quantize_profile) on sys.path."""
  monkeypatch.syspath_prepend(str(pathlib.Path(report.__file__).parent))
  return importlib.import_module("kernel_bounds")


def _plus_one(x):
  def body(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0

  out = jax.ShapeDtypeStruct(x.shape, x.dtype)
  params = plgpu.CompilerParams(num_warps=4)
  return pl.pallas_call(body, out_shape=out, compiler_params=params, name="plus_one")(x)  # traced, never run


def _twice_then_loop(x):
  x = _plus_one(x)
  x, _ = lax.scan(lambda c, _: (_plus_one(c), None), x, None, length=3)
  return x


def test_a_layer_loops_kernel_counts_once_per_iteration(kernel_bounds):
  profile = importlib.import_module("kernels_quantize_profile")
  jaxpr = jax.make_jaxpr(_twice_then_loop)(jnp.zeros((8, 128), jnp.float32)).jaxpr
  launches = [(eqn.params["name"], times) for eqn, times in profile._pallas_launches(jaxpr)]
  assert launches == [("plus_one", 1), ("plus_one", 3)]


def test_measured_time_merges_xlas_suffixes_and_divides_by_the_profiled_steps(kernel_bounds):
  device = {"busy_ms": 30.0, "busy_ms_per_step": 10.0, "top": [["fp4_k", 6.0, 12], ["fp4_k__2", 3.0, 6], ["g", 9, 3]]}
  row = {"model": "experiments", "recipe": "r", "profile": {"/device:GPU:0": device}}
  doc = {"rows": [{"model": "anchor", "recipe": "r", "profile": None}, row]}
  assert kernel_bounds.measured(doc, "r") == {"fp4_k": 3.0, "g": 3.0}  # (6 + 3) / 3 steps, 9 / 3
  assert kernel_bounds.measured(doc, "other") == {} and kernel_bounds.measured(None, "r") == {}


def test_each_kernel_gets_its_issue_time_memory_time_and_larger_limit(kernel_bounds, monkeypatch):
  records = [
    {"name": "a", "times": 12, "warp_instructions": 1_000_000, "sass_per_thread": 900, "bytes": 4_800_000},
    {"name": "a", "times": 1, "warp_instructions": 2_000_000, "sass_per_thread": 700, "bytes": 0},
    {"name": "b", "times": 2, "warp_instructions": 10, "sass_per_thread": 5, "bytes": 48_000_000},
  ]
  monkeypatch.setattr(kernel_bounds, "launch_records", lambda *args: records)
  monkeypatch.setattr(kernel_bounds.hlo_census, "step_and_args", lambda *args: (None, ()))
  rows = kernel_bounds.kernel_rows("r", "125M", 16, 1024, None)
  a, b = sorted(rows, key=lambda r: r["kernel"])
  rate, peak = kernel_bounds.H200_ISSUE_RATE, kernel_bounds.H200_PEAK_BYTES_PER_S
  assert a["launches"] == 13 and a["sass_per_thread"] == [700, 900]
  assert a["issue_ms"] == pytest.approx(1e3 * 14_000_000 / rate)  # 12 x 1M + 2M warp instructions
  assert a["memory_ms"] == pytest.approx(1e3 * 12 * 4_800_000 / peak) and a["limit"] == "issue"
  assert b["memory_ms"] == pytest.approx(1e3 * 96_000_000 / peak) and b["limit"] == "memory"
  assert a["measured_ms"] is None and [r["kernel"] for r in rows] == ["b", "a"]  # by larger limit: 20 ms, 13.4 ms


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs PyPI's Triton (compiles for sm_90)")
def test_launch_records_count_a_kernels_bytes_and_instructions(kernel_bounds):
  profile = importlib.import_module("kernels_quantize_profile")
  (once, looped) = profile.launch_records(_twice_then_loop, jnp.zeros((8, 128), jnp.float32))
  assert (once["times"], looped["times"]) == (1, 3)
  assert once["bytes"] == 2 * 8 * 128 * 4  # the input read and the output written once
  assert once["sass_per_thread"] > 0 and once["warp_instructions"] % once["sass_per_thread"] == 0


def test_report_gives_each_kernel_its_limits_and_the_measured_ratio():
  rows = [
    {"recipe": "r", "kernel": "k", "launches": 3, "sass_per_thread": [10, 20], "issue_ms": 2.0, "memory_ms": 1.0}
    | {"limit": "issue", "measured_ms": 3.0},
    {"recipe": "r", "kernel": "q", "launches": 1, "sass_per_thread": [7], "issue_ms": 0.5, "memory_ms": 1.0}
    | {"limit": "memory", "measured_ms": None},
  ]
  settings = {"model": "125M", "batch": 16, "seq_len": 1024, "peak_bytes_per_s": 4.8e12, "issue_rate": 1.0}
  settings["profile_from"] = {"file": "t.json", "commit": "abc", "device": "NVIDIA H200"}
  doc = {"benchmark": "kernel_bounds", "commit": "aaa", "command": "python benchmarks/kernel_bounds.py"}
  text = "\n".join(report.RENDER["kernel_bounds"](doc | {"settings": settings, "rows": rows}))
  assert "| r | `k` | 3 | 10–20 | 2.00 | 1.00 | 3.00 | 1.50 |" in text  # 3.0 / max(2.0, 1.0)
  assert "| r | `q` | 1 | 7 | 0.50 | 1.00 | - | - |" in text
  assert "4.8 TB/s" in text and "`t.json` (abc, NVIDIA H200" in text


@pytest.mark.parametrize(
  "argv, flag",
  [
    (["--recipes", "nvidia_nvfp4,nvfp9"], "--recipes: unknown recipe(s) ['nvfp9']"),
    (["--profile-from", "no.json"], "--profile-from: no file no.json"),
  ],
)
def test_bad_arguments_are_refused_naming_the_flag(kernel_bounds, argv, flag, capsys):
  with pytest.raises(SystemExit):
    kernel_bounds.main(argv)
  assert flag in capsys.readouterr().err
