"""bench_scaling on one CPU device: the result records (compile time, step time, tokens/s, MFU) and efficiencies."""

import json

import pytest

from fp4jax_experiments import bench_scaling


# slow tier; default representative: a benchmark run; its parts: test_efficiencies_are_per_recipe_and_mesh,
# test_flops_per_token_counts_only_the_experts_a_token_runs_through
@pytest.mark.slow
def test_one_device_records_and_efficiencies(tmp_path, capsys):
  out = tmp_path / "bench.json"
  bench_scaling.main(
    [
      "--model",
      "100K",
      "--recipes",
      "bf16",
      "--devices",
      "1",
      "--per-device-batch",
      "2",
      "--seq-len",
      "64",
      "--steps",
      "2",
      "--warmup",
      "1",
      "--matmul-size",
      "128",
      "--out",
      str(out),
    ]
  )
  records = json.loads(out.read_text())
  assert [r["recipe"] for r in records] == ["bf16"]  # the FP4 models' steps: test_exp_train, test_exp_sharding
  for r in records:
    assert r["compile_s"] > 0 and r["step_time_s"] > 0 and r["scaling_efficiency"] == 1.0
    assert r["tokens_per_s"] == pytest.approx(2 * 64 / r["step_time_s"])
    assert r["mfu"] == pytest.approx(r["tokens_per_s"] * r["flops_per_token"] / (r["matmul_tflops"] * 1e12))
    assert 1.0 < r["loss"] < 10.0
  assert "compile s" in capsys.readouterr().out


def test_efficiencies_are_per_recipe_and_mesh():
  rows = [{"recipe": "bf16", "mesh": "data", "devices": n, "tokens_per_s": t} for n, t in ((1, 100.0), (2, 190.0))]
  rows.append({"recipe": "bf16", "mesh": "model", "devices": 2, "tokens_per_s": 150.0})  # no 1-device base
  got = bench_scaling.efficiencies(rows)
  assert [r["scaling_efficiency"] for r in got] == [1.0, pytest.approx(0.95), None]


def test_too_many_devices_is_refused(capsys):
  with pytest.raises(SystemExit):
    bench_scaling.main(["--model", "100K", "--devices", "1,64"])
  assert "--devices 1,64: only" in capsys.readouterr().err


# slow tier; default representative: a benchmark run; its microbatched step: test_exp_deterministic.py's
# test_losses_and_trained_state_are_bit_identical_on_a_dp_fsdp_tp_mesh[bf16]
@pytest.mark.slow
def test_deterministic_points_run_their_microbatches(tmp_path, monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "")  # the flag appends its XLA flags to the environment (restored after)
  out = tmp_path / "bench.json"
  bench_scaling.main(
    [
      "--model",
      "100K",
      "--recipes",
      "bf16",
      "--devices",
      "1",
      "--per-device-batch",
      "2",
      "--seq-len",
      "64",
      "--steps",
      "1",
      "--warmup",
      "1",
      "--matmul-size",
      "128",
      "--microbatches-per-device",
      "2",
      "--out",
      str(out),
    ]
  )
  [record] = json.loads(out.read_text())
  assert record["deterministic"] == 2 and 1.0 < record["loss"] < 10.0
  assert "--xla_gpu_deterministic_ops=true" in bench_scaling.os.environ["XLA_FLAGS"]


def test_flops_per_token_counts_only_the_experts_a_token_runs_through():
  """1M-moe (4 blocks, d 128, 4 experts of width 128, top 2, bytes): per block 4d² attention + 2d norms + d·E router
  + 2·3·d·h (two experts) = 65536 + 256 + 512 + 98304; final norm 128; embeddings 2·256·128."""
  n = 4 * (65536 + 256 + 512 + 98304) + 128 + 2 * 256 * 128
  assert bench_scaling.flops_per_token("1M-moe", 64) == 6 * n + 12 * 4 * 128 * 64
