"""What the experiments' command lines share: the help formatter, the ETA and the progress display.

The ETA comes from the times of steps that did not compile: the first step after a (re)start compiles the train
step, and counting it would inflate the estimate by the compile time (minutes at 125M) for the whole run.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from tqdm import tqdm


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
  """``--help`` with every optional flag's default, ``(default: X)``, unless its help text already says what it
  defaults to; the description keeps its line breaks (the usage examples of the module docstrings)."""

  def _get_help_string(self, action: argparse.Action) -> str | None:
    if action.required or not action.option_strings or (action.help and "default" in action.help):
      return action.help
    return super()._get_help_string(action)


def parser(prog: str, doc: str) -> argparse.ArgumentParser:
  """An experiments command's parser: ``prog``, the module docstring ``doc`` as its description, defaults shown."""
  return argparse.ArgumentParser(prog=prog, description=doc, formatter_class=HelpFormatter)


class Eta:
  """Remaining time from the mean time of the steps timed so far (windows that hold no compiling step)."""

  def __init__(self) -> None:
    self.seconds = 0.0
    self.steps = 0

  def add(self, seconds: float, steps: int) -> None:
    """Adds a window of ``steps`` steps that took ``seconds`` (none of them compiling)."""
    if seconds < 0 or steps < 0:
      raise ValueError(f"a timed window needs seconds >= 0 and steps >= 0, got {seconds}, {steps}")
    self.seconds += seconds
    self.steps += steps

  def remaining(self, steps_left: int) -> float | None:
    """Seconds for ``steps_left`` more steps at the mean step time; None before any step was timed."""
    return None if self.steps == 0 else self.seconds / self.steps * steps_left


def duration(seconds: float | None) -> str:
  """``1h05m`` from an hour up, ``4m07s`` below; ``--`` for an unknown duration."""
  if seconds is None:
    return "--"
  seconds = int(seconds)
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class Progress:
  """A tqdm bar on a terminal, plain lines otherwise (logs, pipes).

  Args:
    total: the run's last step.
    initial: the step it starts from (a resumed run).
    label: what trains, e.g. ``"nvidia_nvfp4 10M"``.
    stream: where it writes (stderr by default); the bar only if it is a terminal.
  """

  def __init__(self, total: int, initial: int, label: str, stream: TextIO | None = None):
    self.stream = sys.stderr if stream is None else stream
    self.total, self.label = total, label
    self.bar = None
    if self.stream.isatty():
      # tqdm's own rate would count the compiling first step: the ETA is ours, in the postfix
      fmt = "{desc} {percentage:3.0f}%|{bar}| step {n_fmt}/{total_fmt}{postfix}"  # postfix: ", " + text
      self.bar = tqdm(total=total, initial=initial, desc=label, file=self.stream, bar_format=fmt, dynamic_ncols=True)

  def update(self, step: int, text: str) -> None:
    """Shows that ``step`` is done, with ``text`` (loss, tokens/s, ETA)."""
    if self.bar is None:
      print(f"{self.label} | step {step}/{self.total} | {text}", file=self.stream, flush=True)
      return
    self.bar.n = step
    self.bar.set_postfix_str(text, refresh=True)

  def write(self, message: str) -> None:
    """A line of its own (above the bar on a terminal)."""
    if self.bar is None:
      print(message, file=self.stream, flush=True)
    else:
      self.bar.write(message, file=self.stream)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
