"""Training: schedule, loss goes down, exact resume after a kill, config mismatch refused."""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from fp4jax_experiments import optimizer, train

REPO = Path(__file__).resolve().parents[2]
TIMING = {"step_time_s", "tokens_per_s"}


def _config(corpus, **changes):
  fields = dict(
    model="100K",
    tokens=8 * 8 * 64,
    data=corpus,
    batch_size=8,
    seq_len=64,
    log_every=1,
    eval_every=4,
    eval_batches=2,
    ckpt_every=4,
    lr=3e-3,
  )
  return train.TrainConfig(**{**fields, **changes})


def _curve(folder):
  return [{k: v for k, v in r.items() if k not in TIMING} for r in train.read_metrics(folder)]


def test_parse_count():
  assert train.parse_count("200M") == 200_000_000 and train.parse_count("1.5B") == 1_500_000_000
  assert train.parse_count("100k") == 100_000 and train.parse_count("2e6") == 2_000_000
  with pytest.raises(Exception, match="not a count"):
    train.parse_count("lots")


def test_schedule_warmup_cosine_endpoints():
  schedule = optimizer.lr_schedule(1e-3, total_steps=1000, warmup_frac=0.1)
  np.testing.assert_allclose(
    [schedule(0), schedule(100), schedule(550), schedule(1000)], [1e-5, 1e-3, (1e-3 + 1e-4) / 2, 1e-4], rtol=1e-5
  )


def test_bad_train_config_names_the_argument(corpus):
  with pytest.raises(ValueError, match="ckpt_every"):
    _config(corpus, ckpt_every=5, log_every=2)
  with pytest.raises(ValueError, match="tokens"):
    _config(corpus, tokens=10)


# slow tier; default representative: test_pause_and_resume_in_process_and_config_mismatch, test_exp_train_trust.py's
# test_sigint_checkpoints_the_current_step_and_the_rerun_resumes_exactly (the resumed curve and state, bit for bit);
# the loss falls: test_exp_deterministic.py's [bf16] case
@pytest.mark.slow
def test_loss_goes_down_and_resume_after_kill_reproduces_the_curve(corpus, tmp_path):
  config = _config(corpus, tokens=16 * 8 * 64)
  reference = train.train(config, tmp_path / "reference", quiet=True)
  losses = [r["loss"] for r in train.read_metrics(tmp_path / "reference", "train")]
  assert reference["status"] == "finished" and len(losses) == 16
  assert np.mean(losses[-4:]) < 0.75 * np.mean(losses[:2])

  # A real kill: the CLI is SIGKILLed after its step-9 record (checkpoint at 8), then resumed in process.
  killed = tmp_path / "killed"
  args = [
    sys.executable,
    "-m",
    "fp4jax_experiments.train",
    "--out",
    str(killed),
    "--model",
    "100K",
    "--tokens",
    "8192",
    "--data",
    corpus,
    "--batch-size",
    "8",
    "--seq-len",
    "64",
    "--log-every",
    "1",
    "--eval-every",
    "4",
    "--eval-batches",
    "2",
    "--ckpt-every",
    "4",
    "--lr",
    "3e-3",
  ]
  proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 90
  while time.time() < deadline and proc.poll() is None:
    if (killed / "metrics.jsonl").exists() and any(
      json.loads(line)["step"] >= 9 for line in (killed / "metrics.jsonl").read_text().splitlines()
    ):
      break
    time.sleep(0.05)
  assert proc.poll() is None, "the training process ended before it could be killed"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (killed / "summary.json").exists()
  resumed = train.train(config, killed, quiet=True)
  assert resumed["status"] == "finished"
  assert _curve(killed) == _curve(tmp_path / "reference")


def test_pause_and_resume_in_process_and_config_mismatch(corpus, tmp_path, monkeypatch):
  monkeypatch.setenv("FP4JAX_COMMIT", "abc1234")  # the summary's commit (the lease scripts set it)
  config = _config(corpus)
  paused = train.train(config, tmp_path / "run", stop_at_step=4, quiet=True)
  assert paused["status"] == "paused" and paused["step"] == 4
  assert not (tmp_path / "run" / "summary.json").exists()
  with pytest.raises(ValueError, match="different config.*seed"):
    train.train(_config(corpus, seed=1), tmp_path / "run", quiet=True)
  finished = train.train(config, tmp_path / "run", quiet=True)
  assert finished["status"] == "finished" and finished["step"] == 8
  assert json.loads((tmp_path / "run" / "summary.json").read_text())["val_loss"] == finished["val_loss"]
  assert (finished["commit"], finished["device"], finished["jax_version"]) == ("abc1234", "cpu", jax.__version__)
  assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", finished["date"]), finished["date"]
  steps = [r["step"] for r in train.read_metrics(tmp_path / "run", "train")]
  assert steps == list(range(1, 9))


def test_final_evaluation_is_what_evaluate_gives_from_the_checkpoint(corpus, tmp_path):
  """A run that finishes with final_eval_batches writes the per-batch losses that `experiments.evaluate` would
  compute from its last checkpoint; a paused run writes none."""
  from fp4jax_experiments import evaluate

  config = _config(corpus)
  train.train(config, tmp_path / "run", stop_at_step=4, quiet=True, final_eval_batches=3)
  assert not (tmp_path / "run" / train.FINAL_EVAL).exists()
  train.train(config, tmp_path / "run", quiet=True, final_eval_batches=3)
  record = json.loads((tmp_path / "run" / train.FINAL_EVAL).read_text())
  assert record == evaluate.batch_losses(tmp_path / "run", 3)
  assert record["step"] == record["steps"] == 8 and len(record["batch_losses"]) == 3
  with pytest.raises(ValueError, match="final_eval_batches must be >= 0"):
    train.train(config, tmp_path / "other", quiet=True, final_eval_batches=-1)


# slow tier; default representative: tests/kernels/test_dot_pallas.py::test_pallas_backend_matches_xla_bit_for_bit
@pytest.mark.slow
def test_quantizer_backend_changes_nothing_but_the_implementation(corpus, tmp_path):
  """The fused Pallas quantizers (interpret mode here) train the same curve, bit for bit, as XLA's; the backend
  is not part of the run's identity."""
  config = _config(corpus, recipe="nvidia_nvfp4", tokens=3 * 2 * 64, batch_size=2, eval_every=100)
  curves = {}
  for backend in ("xla", "pallas"):  # training steps only: no evaluation program to compile twice
    overrides = {"quantizer_backend": backend}
    train.train(config, tmp_path / backend, quiet=True, model_overrides=overrides, final_eval_batches=0)
    curves[backend] = _curve(tmp_path / backend)
  assert curves["pallas"] == curves["xla"] and len(curves["xla"]) >= 3
  with pytest.raises(ValueError, match="quantizer_backend must be one of"):
    train.Trainer(config, model_overrides={"quantizer_backend": "triton"})


def test_cli_refuses_kernel_quantizers_on_a_model_axis(corpus, tmp_path, capsys):
  """Refused before the data or the mesh: a model axis without --deterministic runs XLA's partitioner."""
  args = ["--data", corpus, "--recipe", "nvidia_nvfp4", "--mesh", "model=2", "--quantizer-backend", "pallas"]
  with pytest.raises(SystemExit):
    train.main([*args, "--out", str(tmp_path)])
  err = capsys.readouterr().err
  assert "--quantizer-backend: quantizer_backend='pallas' trains on one device" in err and "--deterministic R" in err
  assert "mesh model=2" in err


def test_provenance_names_the_checkout_commit_without_the_variable(monkeypatch):
  """Without $FP4JAX_COMMIT the commit is the checkout's HEAD (git's own answer, here the oracle), -dirty when
  tracked files differ; where git cannot answer it is None, never a guess."""
  monkeypatch.delenv("FP4JAX_COMMIT", raising=False)
  git = ["git", "-C", str(REPO)]
  head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
  got = train.provenance()["commit"]
  if head.returncode != 0:
    assert got is None
  else:
    dirty = subprocess.run([*git, "status", "--porcelain", "-uno"], capture_output=True, text=True).stdout.strip()
    assert got == head.stdout.strip() + ("-dirty" if dirty else "")
  monkeypatch.setattr(train.data, "REPO_ROOT", Path("/nonexistent-checkout"))
  assert train.provenance()["commit"] is None
