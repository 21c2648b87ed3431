"""benchmarks/train_throughput.py: the smoke command's JSON document and the ratios it derives (no timings asserted)."""

import json
import math
import os
import subprocess
import sys
import threading

import jax.numpy as jnp
import pytest

from benchmarks import train_throughput

REPO = train_throughput.REPO
TOP_KEYS = {
  "benchmark",
  "complete",
  "header",
  "device_kind",
  "platform",
  "jax_version",
  "commit",
  "date",
  "command",
  "xla_flags",
  "matmul_size",
  "matmul_tflops",
  "settings",
  "rows",
}
ROW_KEYS = {
  "model",
  "recipe",
  "devices",
  "global_batch",
  "seq_len",
  "tokens_per_s",
  "step_time_median_s",
  "step_time_min_s",
  "step_time_rounds_s",
  "mfu",
  "compile_s",
  "flops_per_token",
  "loss",
  "ratio_to_anchor",
  "scaling_efficiency",
  "profile",
  "beside_abandoned_compile",
  "grad_comm_dtype",
  "quantizer_backend",
}


@pytest.fixture(scope="module")
def smoke_doc(tmp_path_factory):
  folder = tmp_path_factory.mktemp("throughput")
  out = folder / "throughput.json"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
  proc = subprocess.run(
    [
      sys.executable,
      "benchmarks/train_throughput.py",
      "--smoke",
      "--commit",
      "abc1234",
      "--out",
      str(out),
      "--profile",
      str(folder / "profile"),
      "--experiments-variants",
      json.dumps({"experiments": {}, "unroll2": {"scan_unroll": 2}}),
      "--max-compile-s",
      "600",
      "--grad-comm-dtype",
      "bfloat16",
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(out.read_text()), proc.stdout


# slow tier; default representative: an end-to-end run of the command (2 devices); its parts:
# test_ratios_are_to_the_anchor_and_to_one_device, test_bad_arguments_are_refused,
# test_a_compile_past_the_budget_is_given_up_and_others_are_kept
@pytest.mark.slow
def test_smoke_writes_every_entry_with_its_metadata(smoke_doc):
  doc, stdout = smoke_doc
  assert TOP_KEYS <= set(doc) and doc["benchmark"] == "train_throughput" and doc["complete"] is True
  assert doc["commit"] == "abc1234" and doc["platform"] == "cpu" and "--smoke" in doc["command"]
  assert doc["xla_flags"] == "" and doc["command"].startswith("python benchmarks/train_throughput.py ")
  assert [(r["model"], r["recipe"], r["devices"]) for r in doc["rows"]] == [
    ("anchor", "bf16", 1),
    ("experiments", "bf16", 1),
    ("unroll2", "bf16", 1),
    ("anchor", "bf16", 2),
    ("experiments", "bf16", 2),
    ("unroll2", "bf16", 2),
  ]
  assert doc["settings"]["experiments_variants"] == {"experiments": {}, "unroll2": {"scan_unroll": 2}}
  assert doc["settings"]["grad_comm_dtype"] == "bfloat16"
  assert doc["settings"]["max_compile_s"] == 600.0 and "--max-compile-s 600" in doc["command"]
  assert '\'{"experiments": {}, "unroll2": {"scan_unroll": 2}}\'' in doc["command"]  # shlex-quoted: re-runnable
  for r in doc["rows"]:
    assert ROW_KEYS <= set(r), ROW_KEYS - set(r)
    assert r["global_batch"] == 2 * r["devices"] and r["seq_len"] == 64
    assert len(r["step_time_rounds_s"]) == doc["settings"]["rounds"] == 1
    assert r["tokens_per_s"] == pytest.approx(r["global_batch"] * 64 / r["step_time_median_s"])
    assert r["mfu"] == pytest.approx(
      r["tokens_per_s"] * r["flops_per_token"] / (r["devices"] * doc["matmul_tflops"] * 1e12)
    )
    assert abs(r["loss"] - math.log(256)) < 1.0  # a few steps from ln(256): both models train on the same bytes
    assert isinstance(r["profile"], dict)
    assert r["beside_abandoned_compile"] is False  # no compile was given up
    # bfloat16 gradients on the 2-device mesh (shard_map: the kernels stay on), none to communicate on one device
    anchor = r["model"] == "anchor"
    assert r["grad_comm_dtype"] == ("bfloat16" if r["devices"] == 2 and not anchor else "float32")
    assert r["quantizer_backend"] == (None if anchor else "auto")
  assert len({r["flops_per_token"] for r in doc["rows"]}) == 1  # one shape, one formula
  assert "weak eff" in stdout


def test_ratios_are_to_the_anchor_and_to_one_device():
  rows = [
    {"model": "anchor", "recipe": "bf16", "devices": 1, "tokens_per_s": 200.0},
    {"model": "experiments", "recipe": "bf16", "devices": 1, "tokens_per_s": 50.0},
    {"model": "anchor", "recipe": "bf16", "devices": 2, "tokens_per_s": 380.0},
    {"model": "experiments", "recipe": "bf16", "devices": 2, "tokens_per_s": 95.0},
    {"model": "experiments", "recipe": "quartet2", "devices": 2, "tokens_per_s": 19.0},
    {"model": "experiments", "recipe": "quartet", "devices": 2, "error": "XlaRuntimeError: out of memory"},
  ]
  got = train_throughput.add_ratios(rows)
  assert [r.get("ratio_to_anchor") for r in got] == [1.0, 0.25, 1.0, 0.25, 0.05, None]
  assert [r.get("scaling_efficiency") for r in got] == [1.0, 1.0, 0.95, 0.95, None, None]
  assert "ratio_to_anchor" not in got[-1]


def test_bad_arguments_are_refused(capsys):
  with pytest.raises(SystemExit):
    train_throughput.main(["--devices", "1,64"])
  assert "--devices 1,64: " in capsys.readouterr().err
  with pytest.raises(SystemExit):
    train_throughput.main(["--steps", "0"])
  assert "--steps must be >= 1, got 0" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    train_throughput.main(["--grad-comm-dtype", "float16"])
  assert "--grad-comm-dtype: invalid choice: 'float16'" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-3", "inf", "nan", "soon"])
def test_max_compile_s_must_be_a_positive_finite_number(value, capsys):
  with pytest.raises(SystemExit):
    train_throughput.main(["--max-compile-s", value])
  assert f"--max-compile-s: must be a finite number of seconds > 0, got '{value}'" in capsys.readouterr().err


# slow tier; default representative: test_report.py::test_train_throughput_reports_tokens_per_second_of_each_round
@pytest.mark.slow
def test_report_renders_one_table_row_per_entry(smoke_doc):
  from benchmarks import report

  doc, _ = smoke_doc
  lines = report.RENDER[doc["benchmark"]](doc)
  rows = [line for line in lines if line.startswith(("| anchor", "| experiments"))]
  assert [line.split(" | ")[:3] for line in rows] == [
    ["| anchor", "bf16", "1"],
    ["| experiments", "bf16", "1"],
    ["| anchor", "bf16", "2"],
    ["| experiments", "bf16", "2"],
  ]
  assert "commit abc1234" in "\n".join(lines)
  first = doc["rows"][0]
  assert rows[0].split(" | ")[3] == f"{first['tokens_per_s']:,.0f}"


@pytest.mark.parametrize(
  "variants", ['{"anchor": {}}', '{"fast": 1}', '[{"scan_unroll": 2}]'], ids=["anchor-label", "not-object", "list"]
)
def test_experiments_variants_must_map_labels_to_override_objects(variants, capsys):
  with pytest.raises(SystemExit):
    train_throughput.main(["--smoke", "--experiments-variants", variants])
  assert "--experiments-variants must map labels other than 'anchor' to JSON objects" in capsys.readouterr().err


class _Lowered:
  """A lowered step whose compile waits for ``release`` (if any), then returns or raises ``error``."""

  def __init__(self, release: threading.Event | None = None, error: Exception | None = None):
    self.release, self.error = release, error

  def compile(self):
    if self.release is not None:
      self.release.wait()
    if self.error:
      raise self.error
    return "compiled"


class _Step:
  def __init__(self, lowered):
    self.lowered = lowered

  def lower(self, *args):
    return self.lowered


def _entry() -> train_throughput.Entry:
  step = lambda state, x: (state + x, state)
  return train_throughput.Entry("experiments", "bf16", 1, 2, 1.0, 0.0, step, jnp.float32(0), [(jnp.float32(1),)])


def test_a_compile_past_the_budget_is_given_up_and_others_are_kept(monkeypatch):
  """A compile still running at the budget raises CompileTimeout and stays in ABANDONED; entries timed while it
  runs are marked ``beside_abandoned_compile``, those after it ended are not; a compile's own error propagates."""
  monkeypatch.setattr(train_throughput, "ABANDONED", [])
  compiled, seconds = train_throughput._compile(_Step(_Lowered()), None, [()], max_seconds=600.0)
  assert compiled == "compiled" and seconds >= 0
  assert not train_throughput.abandoned_compile_running()
  release = threading.Event()
  try:
    with pytest.raises(
      train_throughput.CompileTimeout, match="tracing, lowering and compiling .* --max-compile-s 0.01"
    ):
      train_throughput._compile(_Step(_Lowered(release)), None, [()], max_seconds=0.01)
    assert len(train_throughput.ABANDONED) == 1 and train_throughput.abandoned_compile_running()
    beside = _entry()
    beside.advance(1)
  finally:
    release.set()
  train_throughput.ABANDONED[0].join()
  after = _entry()
  after.advance(1)
  assert beside.beside_abandoned_compile and not after.beside_abandoned_compile
  with pytest.raises(ValueError, match="bad kernel"):
    train_throughput._compile(_Step(_Lowered(error=ValueError("bad kernel"))), None, [()], max_seconds=600.0)


def test_the_command_line_reruns_the_benchmark_under_its_xla_flags():
  """A run under XLA_FLAGS records them in front of its command, shell-quoted, so the command reruns it as it ran."""
  argv = ["--devices", "1", "--experiments-variants", '{"a": {}}']
  plain = "python benchmarks/train_throughput.py --devices 1 --experiments-variants '{\"a\": {}}'"
  assert train_throughput.command_line(argv) == plain
  flags = "--xla_gpu_enable_while_loop_double_buffering=true --xla_gpu_autotune_level=0"
  assert train_throughput.command_line(argv, flags) == f"XLA_FLAGS='{flags}' {plain}"
