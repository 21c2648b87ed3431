"""The experiments' command lines: help and defaults of every flag, --steps, the compile line, the ETA without the
compiling step, the progress display, the loss plot's legend and range."""

import argparse
import io

import pytest

from fp4jax_experiments import cli, compare, evaluate, plots, sweep, train

PARSERS = {
  "fp4jax-train": train.build_parser,
  "fp4jax-sweep": sweep.build_parser,
  "fp4jax-evaluate": evaluate.build_parser,
  "fp4jax-compare": compare.build_parser,
}


@pytest.mark.parametrize("prog", sorted(PARSERS))
def test_every_flag_has_help_and_help_shows_its_default(prog):
  parser = PARSERS[prog]()
  formatter = parser._get_formatter()
  actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
  assert len(actions) >= 5
  for action in actions:
    assert action.help and action.help.strip(), f"{prog} {action.dest}: no help text"
    if action.required or not action.option_strings:
      continue
    shown = formatter._expand_help(action)
    if "default" in action.help:  # the help says it in words (e.g. "default runs/<model>-<recipe>-<tokens>")
      continue
    assert f"(default: {action.default})" in shown, f"{prog} {action.option_strings[0]}: {shown!r}"
  assert "(default: " in parser.format_help()


def test_steps_is_tokens_over_batch_and_sequence_length():
  args = train.build_parser().parse_args(["--steps", "7", "--batch-size", "4", "--seq-len", "32"])
  config = train.config_from_args(args)
  assert config.tokens == 7 * 4 * 32 and config.steps == 7
  assert train.config_from_args(train.build_parser().parse_args(["--tokens", "5000"])).tokens == 5000


def test_steps_and_tokens_together_are_refused(capsys):
  with pytest.raises(SystemExit):
    train.build_parser().parse_args(["--steps", "7", "--tokens", "1M"])
  assert "argument --tokens: not allowed with argument --steps" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    train.build_parser().parse_args(["--steps", "0"])
  assert "argument --steps: must be >= 1, got 0" in capsys.readouterr().err


def test_eta_is_the_mean_time_of_the_timed_steps():
  eta = cli.Eta()
  assert eta.remaining(10) is None and cli.duration(eta.remaining(10)) == "--"
  eta.add(3.0, 2)  # 1.5 s per step
  eta.add(1.5, 2)  # 0.75 s per step: mean 4.5 s / 4 steps
  assert eta.remaining(8) == pytest.approx(9.0)
  assert cli.duration(3725) == "1h02m" and cli.duration(247) == "4m07s"
  with pytest.raises(ValueError, match="seconds >= 0 and steps >= 0"):
    eta.add(-1.0, 1)


# slow tier; default representative: a training run; its parts: test_eta_is_the_mean_time_of_the_timed_steps and
# test_progress_is_a_bar_on_a_terminal_and_plain_lines_elsewhere
@pytest.mark.slow
def test_training_prints_the_compile_and_times_only_the_steps_after_it(corpus, tmp_path, capsys, monkeypatch):
  windows = []
  add = cli.Eta.add
  monkeypatch.setattr(cli.Eta, "add", lambda self, s, n: (windows.append(n), add(self, s, n)))
  config = train.TrainConfig(
    model="100K", tokens=6 * 4 * 32, data=corpus, batch_size=4, seq_len=32, log_every=1, eval_every=6, ckpt_every=6
  )
  summary = train.train(config, tmp_path / "run")
  err = capsys.readouterr().err
  assert summary["status"] == "finished" and summary["step"] == 6
  assert "compiling the train step for bf16 ...\n" in err and "compiled in " in err
  assert "bf16 100K | step 6/6 |" in err and "ETA 0m00s" in err  # plain lines: pytest's stderr is no terminal
  assert sum(windows) == 5  # every step but the first, which compiled (log_every=1: it was a window of its own)


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_progress_is_a_bar_on_a_terminal_and_plain_lines_elsewhere():
  plain = io.StringIO()
  progress = cli.Progress(10, 0, "quartet2 1M", stream=plain)
  progress.update(3, "loss 4.0000 | ETA 0m07s")
  progress.write("compiled in 1.0 s")
  progress.close()
  assert plain.getvalue() == "quartet2 1M | step 3/10 | loss 4.0000 | ETA 0m07s\ncompiled in 1.0 s\n"
  term = _Terminal()
  progress = cli.Progress(10, 2, "quartet2 1M", stream=term)
  progress.update(3, "loss 4.0000 | ETA 0m07s")
  progress.close()
  drawn = term.getvalue()
  assert "\r" in drawn and " 30%|" in drawn and "step 3/10, loss 4.0000 | ETA 0m07s" in drawn
  assert "quartet2 1M | step 3/10" not in drawn


def test_loss_plot_labels_train_and_validation_and_shows_the_whole_curve():
  records = [
    {"kind": "val", "tokens": 0, "val_loss": 5.6},
    *({"kind": "train", "tokens": t, "loss": loss} for t, loss in ((100, 5.5), (200, 3.1), (300, 2.9))),
    {"kind": "val", "tokens": 300, "val_loss": 3.05},
  ]
  fig = plots.loss_curves_figure({"bf16": records, "quartet2": [dict(r) for r in records]})
  ax = fig.axes[0]
  labels = [t.get_text() for t in ax.get_legend().get_texts()]
  assert labels == [
    "bf16 train",
    "bf16 validation (last 3.0500)",
    "quartet2 train",
    "quartet2 validation (last 3.0500)",
  ]
  low, high = ax.get_ylim()
  assert low <= 2.9 and high >= 5.6  # the first evaluation (5.6) and the lowest train loss are inside
  left, right = ax.get_xlim()
  assert left <= 0 and right >= 300


def test_val_curves_show_the_mean_over_seeds_with_a_band():
  """Three seeds of one recipe: their mean curve (hand-computed) and a band from their minimum to their maximum;
  one run of another recipe: its own curve, no band."""

  def run(recipe, seed, losses):
    curve = [[0, 5.6]] + [[t, loss] for t, loss in zip((100, 200), losses)]
    return {"model": "1M", "recipe": recipe, "seed": seed, "tokens": 200, "non_embedding_params": 20,
            "val_curve": curve}  # fmt: skip

  results = [run("quartet2", 0, (3.0, 2.0)), run("quartet2", 1, (3.2, 2.3)), run("quartet2", 2, (3.4, 2.6))]
  results.append(run("bf16", 0, (2.9, 1.9)))
  ax = plots.val_curves_by_size_figure(results).axes[0]
  labels = [t.get_text() for t in ax.get_legend().get_texts()]
  assert labels == ["bf16 (1.900)", "quartet2 (2.300, 3 seeds)"]
  mean = next(line for line in ax.get_lines() if line.get_label().startswith("quartet2"))
  assert list(mean.get_xdata()) == [100, 200] and list(mean.get_ydata()) == pytest.approx([3.2, 2.3])
  (band,) = ax.collections  # one band: quartet2's
  ys = band.get_paths()[0].vertices[:, 1]
  assert min(ys) == pytest.approx(2.0) and max(ys) == pytest.approx(3.4)


def test_paired_differences_plot_each_seed_and_their_mean():
  """Two seeds of ms_fp4 against their own baseline runs (hand-built differences -0.2, -0.1 at 100 tokens and
  -0.1, 0.15 at 200): a thin line per seed and the mean (-0.15, 0.025); the evaluation at 0 tokens is off the log
  axis."""
  from fp4jax_experiments import evaluate

  def run(recipe, seed, losses):
    curve = [[t, loss] for t, loss in zip((0, 100, 200), losses)]
    return {"model": "1M", "recipe": recipe, "seed": seed, "tokens": 200, "val_curve": curve}

  results = [run("ste", 0, (5.0, 3.0, 2.0)), run("ste", 1, (5.0, 3.1, 2.2))]
  results += [run("ms_fp4", 0, (5.0, 2.8, 1.9)), run("ms_fp4", 1, (5.0, 3.0, 2.35))]
  paired = evaluate.paired_curves(results, "ste")
  assert list(paired) == [("1M", 200, "ms_fp4")] and paired[("1M", 200, "ms_fp4")]["at"] == [0, 100, 200]
  ax = plots.paired_differences_figure(paired, "ste").axes[0]
  lines = ax.get_lines()[:3]  # two seeds, then the mean (the zero line follows)
  assert [list(line.get_ydata()) for line in lines] == [
    pytest.approx([-0.2, -0.1]),
    pytest.approx([-0.1, 0.15]),
    pytest.approx([-0.15, 0.025]),
  ]
  assert all(list(line.get_xdata()) == [100, 200] for line in lines)
  assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ms_fp4 (2 seeds; end +0.0250)"]


def test_paired_differences_refuses_nothing_to_draw():
  with pytest.raises(ValueError, match="no recipe has a run paired with a bf16 run of the same seed"):
    plots.paired_differences_figure({}, "bf16")
