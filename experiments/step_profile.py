"""Where a training step's device time goes: a summary of a JAX profiler trace (``perfetto_trace.json.gz``).

  with jax.profiler.trace(folder, create_perfetto_trace=True): ...      # the steps to look at
  summary = step_profile.summarize(step_profile.find_trace(folder), steps=5)

The trace is Chrome-trace JSON: processes named by device ("/device:GPU:0", ...), threads by stream ("Stream #7 ...";
other threads of a device, such as "XLA Ops", repeat the kernels at another level and are only counted in
``threads``), one complete event ("ph": "X", microsecond ``ts`` and ``dur``) per kernel. Per device: ``busy`` = the
length of the union of its kernel intervals, ``span`` = first start to last end, ``busy / span`` (below 1: the device
waits on the host, launches, or the loop), kernel count per step, the kernels with the most total time (by name:
XLA names kernels after their fusions), and the kernel time per step of each category of ``CATEGORIES`` (the first
whose name pattern matches; "other" for none).
"""

from __future__ import annotations

import bisect
import collections
import gzip
import json
import re
from pathlib import Path

TRACE_NAME = "perfetto_trace.json.gz"
# kernel categories, matched in order on the kernel's name (case-insensitive): cuBLAS / cuBLASLt / XLA-Triton GEMMs,
# cuDNN's fused attention, fp4jax's Pallas kernels (``pl.pallas_call`` named fp4_*), copies, collectives, then
# XLA's other fusions (elementwise, reductions, converts)
CATEGORIES = (
  ("gemm", r"gemm|nvjet|xmma|cutlass|cublas"),
  ("attention", r"cudnn|sdpa|flash|fmha"),
  ("pallas", r"^fp4_"),
  ("copy", r"memcpy|memset|^copy"),
  ("collective", r"nccl|all.?reduce|all.?gather|reduce.?scatter"),
  ("fusion", r"fusion|convert|reduce|transpose|slice|broadcast|select|concatenate|scatter|gather"),
)


def category(kernel: str) -> str:
  """The category of a GPU kernel, by name.

  Args:
    kernel: the kernel's name in the profiler trace.

  Returns:
    The label of the first of ``CATEGORIES`` whose pattern matches ``kernel`` (case-insensitive), else "other".
  """
  return next((label for label, pattern in CATEGORIES if re.search(pattern, kernel, re.IGNORECASE)), "other")


def find_trace(folder: str | Path) -> Path:
  """The newest ``perfetto_trace.json.gz`` under ``folder`` (jax.profiler writes plugins/profile/<time>/)."""
  traces = sorted(Path(folder).rglob(TRACE_NAME), key=lambda p: p.stat().st_mtime)
  if not traces:
    raise FileNotFoundError(f"no {TRACE_NAME} under {folder} (trace with create_perfetto_trace=True)")
  return traces[-1]


def _union_length(intervals: list[tuple[float, float]]) -> float:
  total, end = 0.0, float("-inf")
  for start, stop in sorted(intervals):
    if stop > end:
      total += stop - max(start, end)
      end = stop
  return total


SHORT_US = 5.0  # a kernel shorter than this is launch-bound: its launch and tail cost about as much as its work


def summarize(trace: str | Path, steps: int, top: int = 15) -> dict:
  """{device name: {"span_ms", "busy_ms", "busy_fraction", "kernels_per_step", "busy_ms_per_step",
  "top": [[kernel, total ms, calls], ...], "most_launched": [[kernel, calls per step, mean µs], ...],
  "short_kernels": {"under_us", "per_step", "ms_per_step"}, "ms_per_step_by_category": {category: kernel ms per
  step}, "copy_sources": [[XLA op, calls per step, ms per step], ...], "threads": {thread name: [total ms, events]}}}
  over the devices that ran kernels in ``trace`` (a category's
  time sums its kernels' durations, so overlapping kernels count in full). ``top`` ranks kernels by total time,
  ``most_launched`` by launches; ``short_kernels`` counts the kernels under ``SHORT_US`` microseconds (where a step
  pays in launches rather than in work); ``copy_sources`` names the XLA op behind each kernel of the "copy" category
  (``copy_source``), ranked by time."""
  if steps < 1:
    raise ValueError(f"steps must be >= 1, got {steps}")
  with gzip.open(trace, "rt") as f:
    data = json.load(f)
  events = data["traceEvents"] if isinstance(data, dict) else data
  names = {
    e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name" and "pid" in e
  }
  threads = {
    (e["pid"], e.get("tid")): e["args"]["name"]
    for e in events
    if e.get("ph") == "M" and e.get("name") == "thread_name" and "pid" in e
  }
  devices = {pid for pid, name in names.items() if name.startswith("/device:")}
  per_thread = collections.defaultdict(list)
  for e in events:
    if e.get("ph") == "X" and e.get("pid") in devices and e.get("dur") is not None:
      per_thread[e["pid"], e.get("tid")].append(e)
  summary = {}
  for pid in sorted(devices, key=names.get):
    mine = {key: evs for key, evs in per_thread.items() if key[0] == pid}
    streams = [key for key in mine if threads.get(key, "").startswith("Stream")]
    evs = [e for key in (streams or list(mine)) for e in mine[key]]
    if not evs:
      continue
    intervals = [(e["ts"], e["ts"] + e["dur"]) for e in evs]
    span = max(stop for _, stop in intervals) - min(start for start, _ in intervals)
    busy = _union_length(intervals)
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for e in evs:
      by_name[e["name"]][0] += e["dur"]
      by_name[e["name"]][1] += 1
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    launched = sorted(by_name.items(), key=lambda kv: (-kv[1][1], kv[0]))[:top]
    short = [e["dur"] for e in evs if e["dur"] < SHORT_US]
    ops = sorted((e["ts"], e["dur"], e["name"]) for key, t in mine.items() if streams and key not in streams for e in t)
    copy_names = {name for name in by_name if category(name) == "copy"}  # one pattern match per kernel name
    copies = collections.defaultdict(lambda: [0, 0.0])
    for e in evs:
      if e["name"] in copy_names:
        source = copies[copy_source(e, ops)]
        source[0] += 1
        source[1] += e["dur"]
    per_category = collections.Counter()
    for name, (total, _) in by_name.items():
      per_category[category(name)] += total / 1e3 / steps
    summary[names[pid]] = {
      "span_ms": span / 1e3,
      "busy_ms": busy / 1e3,
      "busy_fraction": busy / span if span else 0.0,
      "kernels_per_step": len(evs) / steps,
      "busy_ms_per_step": busy / 1e3 / steps,
      "top": [[name, total / 1e3, calls] for name, (total, calls) in ranked],
      "most_launched": [[name, calls / steps, total / calls] for name, (total, calls) in launched],
      "short_kernels": {"under_us": SHORT_US, "per_step": len(short) / steps, "ms_per_step": sum(short) / 1e3 / steps},
      "ms_per_step_by_category": dict(per_category.most_common()),
      "copy_sources": [
        [name, calls / steps, total / 1e3 / steps]
        for name, (calls, total) in sorted(copies.items(), key=lambda kv: -kv[1][1])[:top]
      ],
      "threads": {threads.get(key, str(key[1])): [sum(e["dur"] for e in t) / 1e3, len(t)] for key, t in mine.items()},
    }
  return summary


OP_WINDOW = 256  # XLA-op events before a kernel's start searched for the one that holds it


def copy_source(kernel: dict, ops: list) -> str:
  """The XLA op a copy kernel belongs to: its ``hlo_op`` argument where the trace records one, else the shortest
  event of the device's non-stream threads (``XLA Ops``, ...) that holds the kernel's interval, among the
  ``OP_WINDOW`` that start last before it (``ops``: those events as sorted (ts, dur, name) triples), else
  "unattributed"."""
  name = (kernel.get("args") or {}).get("hlo_op")
  if name:
    return name
  start, stop = kernel["ts"], kernel["ts"] + kernel["dur"]
  i = bisect.bisect_right(ops, (start, float("inf")))
  held = [op for op in ops[max(0, i - OP_WINDOW) : i] if op[0] + op[1] >= stop]
  return min(held, key=lambda op: op[1])[2] if held else "unattributed"
