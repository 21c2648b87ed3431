"""Trustworthy training runs: checksummed checkpoints with fallback, divergence and signal stops, exact resume
after kill -9 at seeded points, and every file a resume reads checked (a flipped byte is reported, never used)."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from fp4jax_experiments import train

REPO = Path(__file__).resolve().parents[2]
TIMING = {"step_time_s", "tokens_per_s"}
STEPS = 6
# A subprocess that trains the run and SIGKILLs itself at one point: ("step", k) while step k computes,
# ("save", k) just after orbax starts writing the checkpoint of step k, ("manifest", k) once that checkpoint is
# written but before its manifest is.
KILLER = """
import os, signal, sys
from fp4jax_experiments import train
mode, at = sys.argv[1], int(sys.argv[2])
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
step_fn, save, finish = train.Trainer.quant_key, train.RunFolder.save, train.RunFolder._finish_pending
def quant_key(self, step):
    key = step_fn(self, step)
    if mode == "step" and step == at:
        import threading; threading.Timer(0.05, die).start()
    return key
def saving(self, step, state, window):
    save(self, step, state, window)
    if mode == "save" and step == at:
        die()
def finishing(self, wait):
    if mode == "manifest" and self._pending is not None and self._pending["step"] == at:
        self.checkpoints.wait_until_finished()
        die()
    finish(self, wait)
train.Trainer.quant_key, train.RunFolder.save, train.RunFolder._finish_pending = quant_key, saving, finishing
train.main(sys.argv[3:])
"""


def _config(corpus, **changes):
  fields = dict(
    model="100K",
    tokens=STEPS * 8 * 64,
    data=corpus,
    batch_size=8,
    seq_len=64,
    log_every=2,
    eval_every=2,
    eval_batches=1,
    ckpt_every=2,
    lr=3e-3,
  )
  return train.TrainConfig(**{**fields, **changes})


def _curve(folder):
  return [{k: v for k, v in r.items() if k not in TIMING} for r in train.read_metrics(folder)]


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
  """An uninterrupted run (checkpoints at steps 2, 4, 6) and a Trainer of its config (restore templates)."""
  folder = tmp_path_factory.mktemp("reference") / "run"
  assert train.train(_config(corpus), folder, quiet=True)["status"] == "finished"
  trainer = train.Trainer(_config(corpus))
  return folder, trainer, jax.eval_shape(trainer.init_state)


def _restore(folder, reference):
  run = train.RunFolder(folder, reference[1].config)
  try:
    return run.restore(reference[2])
  finally:
    run.close()


def _assert_same_params(folder, reference):
  (state, step), (ref_state, ref_step) = _restore(folder, reference), _restore(reference[0], reference)
  assert step == ref_step == STEPS
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(ref_state), strict=True):
    np.testing.assert_array_equal(np.atleast_1d(a).view(np.uint8), np.atleast_1d(b).view(np.uint8))


def _args(corpus, out):
  return ["--out", str(out), *train.config_to_args(_config(corpus))]


# slow tier; default representative: test_sigint_checkpoints_the_current_step_and_the_rerun_resumes_exactly (an
# interrupted run resumes bit for bit) and, for a checkpoint cut off mid-write,
# test_a_truncated_checkpoint_file_falls_back_and_a_corrupt_run_restores_nothing
@pytest.mark.slow
@pytest.mark.parametrize("seed", [0])
def test_kill_9_during_a_step_and_during_a_checkpoint_write_then_resume_is_bit_exact(
  corpus, reference, tmp_path, seed, capsys
):
  rng = random.Random(seed)
  run = tmp_path / "run"
  at = rng.choice([2, 4])  # a checkpoint write, then (resumed from before it) a later step
  kills = [(rng.choice(["save", "manifest"]), at), ("step", rng.randrange(at + 1, STEPS))]
  for mode, at in kills:
    proc = subprocess.run(
      [sys.executable, "-c", KILLER, mode, str(at), *_args(corpus, run)],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
    )
    assert proc.returncode == -signal.SIGKILL, (mode, at, proc.stderr[-2000:])
    assert not (run / "summary.json").exists()
  assert train.train(_config(corpus), run)["status"] == "finished"
  assert "resuming from step" in capsys.readouterr().err
  assert _curve(run) == _curve(reference[0])
  _assert_same_params(run, reference)


def _copy(reference, tmp_path):
  folder = tmp_path / "run"
  shutil.copytree(reference[0], folder)
  return folder


def _flip(path: Path, offset: int) -> None:
  raw = bytearray(path.read_bytes())
  raw[offset % len(raw)] ^= 0x10
  path.write_bytes(bytes(raw))


def _checkpoint_files(folder):
  step_dir = folder / "ckpt" / str(STEPS)
  return sorted(p.relative_to(step_dir).as_posix() for p in step_dir.rglob("*") if p.is_file())


def test_a_flipped_byte_in_any_checkpoint_file_falls_back_to_the_previous_checkpoint(reference, tmp_path, capsys):
  names = _checkpoint_files(reference[0])
  assert train.MANIFEST in names and len(names) > 5
  rng = random.Random(1)
  for i, name in enumerate(names):
    folder = _copy(reference, tmp_path / str(i))
    _flip(folder / "ckpt" / str(STEPS) / name, rng.randrange(1 << 20))
    _, step = _restore(folder, reference)
    err = capsys.readouterr().err
    assert step == STEPS - 2, name
    assert f"checkpoint {STEPS} does not restore" in err and "falling back" in err, name
    assert name in err or train.MANIFEST in err, (name, err)
    assert (folder / train.REJECTED / str(STEPS) / name).exists()
    assert [r["step"] for r in train.read_metrics(folder)][-1] == STEPS - 2


def test_a_truncated_checkpoint_file_falls_back_and_a_corrupt_run_restores_nothing(reference, tmp_path, capsys):
  folder = _copy(reference, tmp_path)
  data_files = sorted((folder / "ckpt" / str(STEPS)).rglob("d/*"), key=lambda p: -p.stat().st_size)
  with open(data_files[0], "r+b") as f:
    f.truncate(data_files[0].stat().st_size // 2)
  assert _restore(folder, reference)[1] == STEPS - 2
  assert str(data_files[0].relative_to(folder / "ckpt" / str(STEPS))) in capsys.readouterr().err
  for step in (STEPS - 2, STEPS - 4):
    _flip(folder / "ckpt" / str(step) / "default" / "_METADATA", 7)
  with pytest.raises(train.CheckpointError, match="no checkpoint of .* restores:(.|\n)*_METADATA"):
    _restore(folder, reference)


def test_metrics_and_config_corruption_is_detected(reference, tmp_path, capsys):
  # a cut-off last line (killed while writing it) is dropped with a warning
  folder = _copy(reference, tmp_path / "cut")
  with open(folder / "metrics.jsonl", "a") as f:
    f.write('{"step": 7, "kind": "tra')
  assert _restore(folder, reference)[1] == STEPS
  assert "dropped a cut-off last line" in capsys.readouterr().err
  assert _curve(folder) == _curve(reference[0])
  # a flipped byte in a record of the last window: the previous checkpoint's records still verify
  folder = _copy(reference, tmp_path / "flip")
  _flip(folder / "metrics.jsonl", len((folder / "metrics.jsonl").read_bytes()) - 5)
  assert _restore(folder, reference)[1] == STEPS - 2
  assert "metrics.jsonl" in capsys.readouterr().err
  # config.json: a changed byte that is still valid JSON is caught by the checkpoints' record of it
  folder = _copy(reference, tmp_path / "config")
  text = (folder / "config.json").read_text()
  (folder / "config.json").write_text(text.replace('"seed": 0', '"seed": 1'))
  with pytest.raises(train.CheckpointError, match="config.json: sha256 .* corrupted or edited"):
    train.RunFolder(folder, reference[1].config)
  (folder / "config.json").write_text(text.replace("{", "[", 1))
  with pytest.raises(train.CheckpointError, match="config.json"):
    train.RunFolder(folder, reference[1].config)


def test_sigint_checkpoints_the_current_step_and_the_rerun_resumes_exactly(
  corpus, reference, tmp_path, monkeypatch, capsys
):
  step_fn = train.Trainer.quant_key

  def quant_key(self, step):  # SIGINT while step 3 runs: mid logging window
    if step == 2:
      os.kill(os.getpid(), signal.SIGINT)
    return step_fn(self, step)

  monkeypatch.setattr(train.Trainer, "quant_key", quant_key)
  run = tmp_path / "run"
  with pytest.raises(SystemExit) as exit_info:
    train.main(_args(corpus, run))
  assert exit_info.value.code == 128 + signal.SIGINT
  err = capsys.readouterr().err
  assert "SIGINT: wrote the checkpoint of step 3" in err and "Traceback" not in err
  assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
  monkeypatch.setattr(train.Trainer, "quant_key", step_fn)
  assert train.train(_config(corpus), run)["status"] == "finished"
  assert f"resuming from step 3 (checkpoint {run / 'ckpt' / '3'})" in capsys.readouterr().err
  assert _curve(run) == _curve(reference[0])
  _assert_same_params(run, reference)


def test_divergence_stops_with_the_last_finite_checkpoint(corpus, tmp_path, capsys):
  run = tmp_path / "run"
  with pytest.raises(SystemExit) as exit_info:
    train.main(["--out", str(run), *train.config_to_args(_config(corpus, lr=1e30))])
  assert exit_info.value.code == 1
  err = capsys.readouterr().err
  assert "diverged at step" in err
  summary = json.loads((run / "summary.json").read_text())
  assert summary["status"] == "diverged" and summary["step"] < STEPS
  for step_dir in (run / "ckpt").iterdir():
    state, _ = _restore_step(run, corpus, int(step_dir.name))
    assert all(np.isfinite(np.asarray(x, np.float32)).all() for x in jax.tree.leaves(state))


def _restore_step(run, corpus, step):
  import orbax.checkpoint as ocp

  trainer = train.Trainer(_config(corpus, lr=1e30))
  with ocp.CheckpointManager(run / "ckpt") as manager:
    return manager.restore(step, args=ocp.args.StandardRestore(trainer.init_state())), step


@pytest.mark.parametrize("flag", ["--lr", "--clip-norm", "--weight-decay", "--warmup-frac"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_non_finite_or_negative_hyperparameters_are_refused_naming_the_flag(flag, value, tmp_path, capsys):
  with pytest.raises(SystemExit):
    train.main([flag, value, "--out", str(tmp_path)])
  assert f"argument {flag}: '{value}' is not" in capsys.readouterr().err
  with pytest.raises(ValueError, match=flag[2:].replace("-", "_")):
    train.TrainConfig(**{flag[2:].replace("-", "_"): float(value)})
