"""benchmarks/pallas_ablation.py: the two variants really differ in the implementation their traces call, the
registry is left as it was, the JSON and its report section (no timings asserted)."""

import json

import numpy as np
import pytest

from benchmarks import pallas_ablation, report
from fp4jax._src import backends, estimators


def test_the_variants_trace_the_kernel_or_not_and_leave_the_registry_as_it_was(monkeypatch):
  """The pallas variant's trace calls the Pallas select (on a faked GPU "auto" offers it), the xla variant's never;
  afterwards the Pallas implementation is registered again."""
  backends.load_plugins()
  pallas = backends.implementation(estimators.SELECT_OP, "pallas")
  monkeypatch.setattr(backends, "has_pallas_triton", lambda device=None: True)  # as on an H100
  rows = pallas_ablation.rows(estimators.SELECT_OP, "ms_fp4", "100K", 2, 64, "stdlib", 1, 1, 2)
  assert [r["variant"] for r in rows] == ["pallas", "xla"]
  assert rows[0]["pallas_calls_traced"] > 0 and rows[1]["pallas_calls_traced"] == 0
  assert all(len(r["ms_per_step_rounds"]) == 2 and np.isfinite(r["loss"]) for r in rows)
  assert backends.implementation(estimators.SELECT_OP, "pallas") is pallas


def test_a_failed_build_restores_the_registry_and_an_op_without_kernel_is_named(monkeypatch):
  backends.load_plugins()
  pallas = backends.implementation(estimators.SELECT_OP, "pallas")
  monkeypatch.setattr(pallas_ablation.train_throughput, "experiments_entry", lambda *a: 1 / 0)
  with pytest.raises(ZeroDivisionError):
    pallas_ablation.rows(estimators.SELECT_OP, "ms_fp4", "100K", 2, 64, "stdlib", 1, 1, 1)
  assert backends.implementation(estimators.SELECT_OP, "pallas") is pallas
  with pytest.raises(ValueError, match="--op 'no_such_op' has no 'pallas' implementation"):
    pallas_ablation.rows("no_such_op", "ms_fp4", "100K", 2, 64, "stdlib", 1, 1, 1)


def test_command_writes_its_document_and_the_report_renders_it(tmp_path, monkeypatch):
  fake = [
    {
      "variant": "pallas",
      "pallas_calls_traced": 24,
      "ms_per_step_rounds": [60.0, 64.0, 66.0],
      "tokens_per_s": 1000.0,
      "compile_s": 1.0,
      "loss": 3.0,
    },
    {
      "variant": "xla",
      "pallas_calls_traced": 0,
      "ms_per_step_rounds": [80.0, 81.0, 79.0],
      "tokens_per_s": 800.0,
      "compile_s": 1.0,
      "loss": 3.0,
    },
  ]
  seen = {}
  monkeypatch.setattr(pallas_ablation, "rows", lambda **kw: seen.update(kw) or fake)
  out = tmp_path / "a.json"
  pallas_ablation.main(["--op", "inverse_rotate", "--recipe", "quartet", "--commit", "abc1234", "--out", str(out)])
  doc = json.loads(out.read_text())
  assert (doc["benchmark"], doc["commit"], doc["settings"]["op"], doc["settings"]["model"]) == (
    "pallas_ablation",
    "abc1234",
    "inverse_rotate",
    "125M",
  )
  assert seen["recipe"] == "quartet" and seen["rounds"] == 3
  section = "\n".join(report._pallas_ablation(doc))
  assert "### quartet's 125M step with and without the Pallas inverse_rotate" in section
  assert "| pallas | 24 | 64.0 (60.0–66.0) | 1,000 | 0.800 |" in section and "| xla | 0 |" in section


@pytest.mark.parametrize("flag", ["--batch", "--seq-len", "--warmup", "--steps", "--rounds"])
def test_a_count_below_one_is_refused_naming_the_flag(flag, capsys):
  with pytest.raises(SystemExit):
    pallas_ablation.main(["--op", "inverse_rotate", "--recipe", "quartet", flag, "0"])
  err = capsys.readouterr().err
  assert flag in err and "expected a positive integer, got '0'" in err
