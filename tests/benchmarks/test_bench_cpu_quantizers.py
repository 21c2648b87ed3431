"""benchmarks/cpu_quantizers.py: argument refusals, the rows of two trees' runs, and a small in-process measurement."""

import pytest

from benchmarks import cpu_quantizers


@pytest.mark.parametrize(
  ("extra", "match"),
  [
    (["--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["--rows", "0"], "--rows must be at least 1, got 0"),
    ([], "expected a folder holding another commit's fp4jax/ and kernels/"),
  ],
)
def test_bad_arguments_are_refused_naming_the_flag(tmp_path, extra, match, capsys):
  with pytest.raises(SystemExit):
    cpu_quantizers.main(["--baseline", str(tmp_path), *extra])
  assert match in capsys.readouterr().err


def test_rows_take_medians_over_rounds_and_compare_checksums():
  run = lambda ms, s: {"q fwd_lhs": {"ms": ms, "checksum": s}}  # noqa: E731
  rows = cpu_quantizers.rows_of({"this": [run(1.0, 5.0), run(3.0, 5.0)], "baseline": [run(8.0, 5.0), run(4.0, 5.0)]})
  assert rows == [
    {
      "name": "q fwd_lhs",
      "this_ms": 2.0,
      "baseline_ms": 6.0,
      "ratio": pytest.approx(1 / 3),
      "this_rounds": [1.0, 3.0],
      "baseline_rounds": [8.0, 4.0],
      "same_output": True,
    }
  ]
  other = cpu_quantizers.rows_of({"this": [run(1.0, 5.0)], "baseline": [run(1.0, 6.0)]})
  assert other[0]["same_output"] is False


def test_measure_times_each_operand_of_each_recipe():
  got = cpu_quantizers.measure(["nvfp4_rtn"], rows=32, cols=128, repeats=1)
  assert set(got) == {"nvfp4_rtn fwd_lhs", "nvfp4_rtn dgrad_lhs"}
  assert all(v["ms"] > 0 and v["checksum"] > 0 for v in got.values())
