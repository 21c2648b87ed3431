"""Timing helpers shared by the ``bench.py`` scripts: wall-clock medians of synchronized calls, and a header."""

from __future__ import annotations

import datetime
import statistics
import time

import jax


def header() -> str:
  dev = jax.devices()[0]
  return (f"device: {dev.device_kind} ({dev.platform}); jax {jax.__version__}; "
          f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")


def time_ms(fn, *args, warmup: int = 3, iters: int = 20) -> float:
  """Median milliseconds of ``fn(*args)`` (jitted by the caller), each call synchronized."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return 1e3 * statistics.median(times)
