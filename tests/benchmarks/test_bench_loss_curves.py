"""benchmarks/loss_curves.py: every step's loss per variant and run, and the differences between runs (CPU, tiny)."""

import json
import re

import numpy as np
import pytest

from benchmarks import loss_curves, report


def test_runs_record_every_loss_and_their_differences(tmp_path):
  out = tmp_path / "lc.json"
  variants = {"none": {"recompute": "none"}, "norms": {"recompute": "norms"}}
  argv = ["--variants", json.dumps(variants), "--model", "100K", "--batch", "2", "--seq-len", "32", "--steps", "3"]
  loss_curves.main([*argv, "--rounds", "2", "--commit", "abc", "--out", str(out)])
  doc = json.loads(out.read_text())
  assert list(doc["runs"]) == ["none#1", "norms#1", "none#2", "norms#2"]
  assert all(len(losses) == 3 and np.all(np.isfinite(losses)) for losses in doc["runs"].values())
  assert doc["runs"]["none#1"] == doc["runs"]["none#2"]  # the CPU repeats a program's bits: no run-to-run noise
  assert len(doc["differences"]) == 6  # every pair of the four runs
  for d in doc["differences"]:  # recomputed here from the stored losses
    diff = np.asarray(doc["runs"][d["a"]]) - np.asarray(doc["runs"][d["b"]])
    assert (d["mean_abs"], d["max_abs"], d["last"]) == (np.mean(np.abs(diff)), np.max(np.abs(diff)), diff[-1])
  text = "\n".join(report.RENDER["loss_curves"](doc))
  assert "| none#1 vs none#2 | 0.0000 | 0.0000 | +0.0000 |" in text
  assert 'Variants: `none`: {"recompute": "none"}; `norms`: {"recompute": "norms"}.' in text


@pytest.mark.parametrize(
  ("argv", "match"),
  [
    (["--variants", "[]"], "--variants must be a non-empty JSON object of ModelConfig overrides, got \\[\\]"),
    (["--variants", '{"a": 1}'], "--variants must be a non-empty JSON object"),
    (["--variants", "{}", "--steps", "1"], "--variants must be a non-empty JSON object"),
    (["--variants", '{"a": {}}', "--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["--variants", '{"a": {}}', "--steps", "0"], "--steps must be at least 1, got 0"),
  ],
)
def test_bad_arguments_are_refused_naming_the_flag(argv, match, capsys):
  with pytest.raises(SystemExit):
    loss_curves.main(argv)
  assert re.search(match, capsys.readouterr().err)
