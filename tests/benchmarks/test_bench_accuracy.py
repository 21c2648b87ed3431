"""benchmarks/accuracy.py: its quantization-error document (small, on the CPU) and the report's table of it."""

import pytest

from benchmarks import accuracy, benchtools, report
from fp4jax_experiments import quant_error_table


# slow tier; default representative: every quantizer against tests/oracles.py (tests/test_oracles_*.py) and the
# committed document's table (test_report.py::test_committed_benchmarks_md_is_what_the_report_generates)
@pytest.mark.slow
def test_quant_error_document_has_every_quantizer_and_renders():
  where = benchtools.provenance("abc1234", "python benchmarks/accuracy.py --commit abc1234")
  doc = accuracy.quant_error(rows=64, keys=2, where=where)
  assert [r["name"] for r in doc["rows"]] == list(quant_error_table.PUBLISHED)
  rtn = doc["rows"][0]
  # Quartet II's published RTN relative MSE is 9.0e-3; 64 rows x 128 values put ours within a few 1e-4 of it
  assert rtn["published_rel_mse"] == pytest.approx(9.0e-3) and abs(rtn["rel_mse"] - 9.0e-3) < 1.5e-3
  lines = report.RENDER["quant_error"](doc)
  assert lines[2].startswith("Device: cpu") and "commit abc1234" in lines[2]
  assert any(line.startswith("| RTN | ") and "| 9.0 |" in line for line in lines)
