"""Helpers shared by the benchmark scripts: wall-clock medians of synchronized calls, a result document's header,
provenance and rerun command, and its atomic write."""

from __future__ import annotations

import datetime
import json
import pathlib
import shlex
import statistics
import time

import jax
import jax.numpy as jnp

from fp4jax_experiments.train import source_commit


def header() -> str:
  dev = jax.devices()[0]
  return (
    f"device: {dev.device_kind} ({dev.platform}); jax {jax.__version__}; "
    f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
  )


def commit() -> str:
  """This code's commit for a result document: ``fp4jax_experiments.train.source_commit()`` ($FP4JAX_COMMIT, else
  git's HEAD, ``-dirty`` where tracked files differ from it), or "unknown"."""
  return source_commit() or "unknown"


def provenance(commit: str, command: str) -> dict:
  """A result document's where and how: the first JAX device's kind and platform, the JAX version, ``commit``, the
  date (UTC, to the minute) and ``command``."""
  device = jax.devices()[0]
  return {
    "device_kind": device.device_kind,
    "platform": device.platform,
    "jax_version": jax.__version__,
    "commit": commit,
    "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    "command": command,
  }


def command_line(script: str, argv: list[str], xla_flags: str = "") -> str:
  """The shell command that reruns ``script`` (e.g. ``benchmarks/loop_copies.py``) with ``argv``, ``XLA_FLAGS``
  first where the run had any."""
  prefix = f"XLA_FLAGS={shlex.quote(xla_flags)} " if xla_flags else ""
  return prefix + shlex.join(["python", script, *argv])


def write_json(out: str | pathlib.Path, doc: dict) -> None:
  """``doc`` as JSON at ``out``: written whole beside it, then renamed over the old document (a run stopped midway
  leaves the old document, never half of the new one)."""
  out = pathlib.Path(out)
  out.parent.mkdir(parents=True, exist_ok=True)
  partial = out.with_name(out.name + ".partial")
  partial.write_text(json.dumps(doc, indent=1) + "\n")
  partial.replace(out)


def time_ms(fn, *args, warmup: int = 3, repeats: int = 7, calls: int = 10) -> float:
  """Milliseconds per call of ``fn(*args)`` (jitted by the caller): median over ``repeats`` of ``calls`` back-to-back
  asynchronous calls synchronized once (launch overhead hidden behind the queued device work)."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = [fn(*args) for _ in range(calls)]
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t0) / calls)
  return 1e3 * statistics.median(times)


def time_distinct_ms(fn, arg_sets, **kwargs) -> float:
  """Milliseconds per call of ``fn(*args)`` over the distinct ``arg_sets``, all in one jitted program: device time
  without host dispatch between calls (which ``time_ms`` cannot hide for calls of tens of microseconds) and without
  one call's operands still in L2 for the next (distinct buffers, e.g. 8 weight matrices)."""
  f = jax.jit(lambda sets: sum(jnp.sum(fn(*args).astype(jnp.float32)) for args in sets))
  return time_ms(f, list(arg_sets), **kwargs) / len(arg_sets)
