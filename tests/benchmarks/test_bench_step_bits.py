"""benchmarks/step_bits.py: the first differing step of two loss sequences, its argument checks, and its report
section (no run asserted: a 125M step runs on a GPU)."""

import pytest

from benchmarks import report, step_bits


def test_first_difference_is_the_first_index_where_the_losses_differ():
  a = [(1.0).hex(), (2.0).hex(), (3.0).hex()]
  assert step_bits.first_difference(a, list(a)) is None
  assert step_bits.first_difference(a, [a[0], (2.5).hex(), (3.5).hex()]) == 1


@pytest.mark.parametrize("flag", ["--steps", "--batch", "--seq-len"])
def test_a_count_below_one_is_refused_by_name(flag, capsys):
  with pytest.raises(SystemExit):
    step_bits.main([flag, "0"])
  assert f"{flag} must be >= 1, got 0" in capsys.readouterr().err


def test_the_report_gives_each_pairs_first_difference_and_last_losses():
  doc = {
    "benchmark": "step_bits",
    "device_kind": "NVIDIA H200",
    "commit": "abc1234",
    "command": "python benchmarks/step_bits.py",
    "settings": {"model": "125M", "recipe": "quartet2", "steps": 2, "batch": 16, "seq_len": 1024},
    "losses": {
      name: [(4.0).hex(), (v).hex()] for name, v in (("loop", 3.0), ("loop again", 3.25), ("prequantized", 3.0))
    },
    "first_difference": {"loop / loop again": 1, "loop / prequantized": None},
  }
  lines = report.RENDER["step_bits"](doc)
  assert "| loop / loop again | 1 | 3.0000, 3.2500 |" in lines
  assert "| loop / prequantized | none | 3.0000, 3.0000 |" in lines
