"""benchmarks/compile_profile.py: its document is written after every variant, so a variant cut off by a timeout
(quartet2's unrolled compile runs for minutes) keeps the ones measured before it."""

import json

import pytest

from benchmarks import compile_profile


def test_each_finished_variant_is_written_before_the_next_starts(tmp_path, monkeypatch):
  out = tmp_path / "profile.json"
  seen = []

  def measure(model, recipe, overrides, seq_len, batch, top):
    if seen:  # the second variant: the first must already be on disk, as a whole document
      doc = json.loads(out.read_text())
      assert list(doc["variants"]) == ["loop"] and doc["variants"]["loop"]["compile_s"] == 1.5
      raise TimeoutError("cut off")
    seen.append(overrides)
    return {
      "trace_s": 0.5,
      "lower_s": 0.25,
      "compile_s": 1.5,
      "optimized_hlo_lines": 10,
      "custom_calls": 0,
      "host_events": [["pass", 1000.0, 1]],
    }

  monkeypatch.setattr(compile_profile, "measure", measure)
  variants = json.dumps({"loop": {"scan_unroll": 1}, "unrolled": {"scan_unroll": 12}})
  with pytest.raises(TimeoutError):
    compile_profile.main(["--recipe", "quartet2", "--variants", variants, "--commit", "abc", "--out", str(out)])
  assert seen == [{"scan_unroll": 1}]
  doc = json.loads(out.read_text())
  assert doc["benchmark"] == "compile_profile" and doc["commit"] == "abc"
  assert doc["command"].startswith("python benchmarks/compile_profile.py --recipe quartet2")
  assert list(doc["variants"]) == ["loop"]
