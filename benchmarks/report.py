"""Generates BENCHMARKS.md, the whole file, from the result files committed under benchmarks/results/.

    python benchmarks/report.py            # rewrites BENCHMARKS.md
    python benchmarks/report.py --check    # exit status 1 if BENCHMARKS.md differs from what it would write

One short section per benchmark: what it measures, the device, JAX version, commit and date of the run, the command
that reproduces it, and the numbers. Where a result file holds several rounds or keys, the table gives the range over
them (or mean ± sd), never one round as the number; a ratio says whether its two sides ran in the same process. A
result file with a ``"stale"`` field is reported under a STALE heading with that reason. The history of the numbers
is in CHANGELOG.md and the commit messages, not here.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import statistics
import sys
from collections.abc import Callable

from fp4jax_experiments import step_profile

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MAX_LINES = 500
# The order of the sections; a result file of a benchmark not listed here is an error (it would not be reported).
ORDER = (
  "train_throughput",
  "compile_profile",
  "hlo_census",
  "kernel_bounds",
  "loop_copies",
  "loss_curves",
  "step_bits",
  "linear_trees",
  "cpu_quantizers",
  "occ_bounds",
  "pallas_ablation",
  "prepass_sweep",
  "profile_linear",
  "auto_threshold",
  "quant_error",
  "recipe_errors",
)
ABANDONED_MARK = "†"  # a train_throughput row measured beside an abandoned compile
_HEADER = re.compile(r"device: (?P<device>[^;]+)(?:; jax (?P<jax>[^;]+))?(?:; date: (?P<date>.+))?")


def _header_fields(doc: dict) -> dict[str, str]:
  """device / jax / date from ``benchtools.header()``'s line, for documents that only carry that line."""
  m = _HEADER.match(doc.get("header", ""))
  return {k: v for k, v in (m.groupdict() if m else {}).items() if v}


def provenance(doc: dict) -> list[str]:
  """The lines saying where and how a result was measured: device, JAX version, commit, date; the command (a
  ``"reproduce"`` field where the run's own command no longer runs as it was, e.g. a flag since removed: its note
  then gives the run's own)."""
  head = _header_fields(doc)
  device = doc.get("device_kind") or head.get("device", "not recorded")
  if "device_kind" in doc and "platform" in doc:
    device = f"{device} ({doc['platform']})"
  jax_version = doc.get("jax_version") or head.get("jax", "not recorded")
  date = doc.get("date") or head.get("date", "not recorded")
  return [
    f"Device: {device}; JAX {jax_version}; commit {doc.get('commit', 'not recorded')}; date {date}.",
    "",
    f"Reproduce: `{doc.get('reproduce', doc.get('command', 'not recorded'))}`",
  ]


def spread(values: list[float], spec: str) -> str:
  """``median (min–max)`` of several values, or the one value, each formatted with ``spec``."""
  if len(values) == 1:
    return format(values[0], spec)
  return f"{statistics.median(values):{spec}} ({min(values):{spec}}–{max(values):{spec}})"


STALE_TABLES = "Tables left out (they stay in its result file)."


def _title(doc: dict, title: str) -> list[str]:
  """The section's heading (STALE and the reason for a file with a ``"stale"`` field), then the file's ``"note"``
  (what a reader needs to read its settings against today's code), if any."""
  note = [f"**Note:** {doc['note']}", ""] if "note" in doc else []
  if "stale" in doc:
    return [f"### STALE: {title}", "", f"**Stale:** {doc['stale']} {STALE_TABLES}", "", *note]
  return [f"### {title}", "", *note]


def _variants(settings: dict) -> str:
  """The experiments models' ModelConfig overrides, by row label ("" when the run had only the defaults)."""
  variants = settings.get("experiments_variants") or {"experiments": settings.get("experiments_overrides", {})}
  if list(variants.items()) == [("experiments", {})]:
    return ""
  parts = [f"`{label}`: {json.dumps(over) if over else 'the defaults'}" for label, over in variants.items()]
  return " Experiments models (ModelConfig overrides): " + "; ".join(parts) + "."


def _grad_comm(settings: dict, rows: list[dict]) -> str:
  """How the experiments models on several devices communicated gradients and quantized ("" for float32)."""
  dtype = settings.get("grad_comm_dtype", "float32")
  if dtype == "float32":
    return ""
  backends = sorted({str(r.get("quantizer_backend")) for r in rows if r["model"] != "anchor" and r["devices"] > 1})
  return (
    f" On more than one device the experiments models all-reduce their gradients in {dtype} (`--grad-comm-dtype`: "
    f"data parallelism under `shard_map`, each device quantizing its token shard; quantizers {', '.join(backends)}); "
    "the anchor's are float32."
  )


def _train_throughput(doc: dict) -> list[str]:
  s = doc["settings"]
  counts = sorted({r["devices"] for r in doc["rows"]})
  gpus = " and ".join(map(str, counts)) + (" device" if counts == [1] else " devices")
  title = f"Training throughput, {s['model']}, {s['per_device_batch']} x {s['seq_len']} tokens per device, {gpus}"
  out = _title(doc, title) + provenance(doc)
  out += [
    "",
    f"The experiments' Llama (`fp4jax_experiments.train.Trainer`) under each recipe and a plain-JAX bf16 anchor "
    f"(`benchmarks/anchor.py`, attention {s['anchor_attention']}), all in one process: {s['warmup']} warm-up steps, "
    f"then {s['rounds']} interleaved rounds of {s['steps']} steps each. tokens/s is from the median step time over "
    f'the rounds, then the range over the rounds; "/ anchor" is a ratio within that one process. MFU is against '
    f"the bf16 GEMM rate measured in the same run ({doc['matmul_tflops']:.0f} TFLOP/s)."
    + ("" if doc.get("complete", True) else " INCOMPLETE: the run stopped before its last device count.")
    + _variants(s)
    + _grad_comm(s, doc["rows"]),
    "",
    "| model | recipe | devices | tokens/s | tokens/s over rounds | ms/step | MFU | / anchor | / bf16 "
    "| weak scaling | compile s |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  fmt = lambda x, spec: "" if x is None else format(x, spec)
  ok = [r for r in doc["rows"] if "error" not in r]
  bf16 = {(r["model"], r["devices"]): r for r in ok if r["recipe"] == "bf16"}
  for r in doc["rows"]:
    mark = ABANDONED_MARK if r.get("beside_abandoned_compile") else ""
    head = f"| {r['model']} | {r['recipe']}{mark} | {r['devices']} |"
    if "error" in r:
      out.append(f"{head} failed: {r['error'][:100].replace('|', '/')} | | | | | | | |")
      continue
    tokens = r["global_batch"] * r["seq_len"]
    per_round = [tokens / t for t in r.get("step_time_rounds_s", [])]
    rng = f"{min(per_round):,.0f}–{max(per_round):,.0f}" if len(per_round) > 1 else "one round"
    eff = fmt(r["scaling_efficiency"], ".1%") if r["devices"] > 1 else ""
    base = bf16.get((r["model"], r["devices"]))
    over_bf16 = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}" if base else ""
    out.append(
      f"{head} {r['tokens_per_s']:,.0f} | {rng} | {r['step_time_median_s'] * 1e3:.1f} | {r['mfu']:.1%} | "
      f"{fmt(r['ratio_to_anchor'], '.2f')} | {over_bf16} | {eff} | {r['compile_s']:.0f} |"
    )
  if any(r.get("beside_abandoned_compile") for r in doc["rows"]):
    out += [
      "",
      f"{ABANDONED_MARK} compiled or timed while a compile given up at `--max-compile-s` "
      f"({s.get('max_compile_s')} s) still ran in the background: its numbers are skewed.",
    ]
  return out + _step_categories(ok, bf16)


def _step_categories(rows: list[dict], bf16: dict) -> list[str]:
  """Where each profiled entry's step time goes: kernel ms per step by category (``step_profile.CATEGORIES``), and
  for each non-bf16 row the difference from its model's bf16 row."""
  profiled = []
  for r in rows:
    device = next(iter((r.get("profile") or {}).values()), None)
    if device and "ms_per_step_by_category" in device:
      profiled.append((r, device))
  if not profiled:
    return []
  columns = [label for label, _ in step_profile.CATEGORIES] + ["other"]
  out = [
    "",
    "GPU kernel time per step by category, from the profile of the same run (ms; a category sums its kernels' "
    "durations; pallas = fp4jax's Pallas kernels, fusion = XLA's other fusions; "
    "`experiments/step_profile.py`). Δ bf16 is the row minus its model's bf16 row. short: the kernels under "
    f"{step_profile.SHORT_US:g} µs per step and their ms (blank where the profile predates the count).",
    "",
    "| model | recipe | devices | busy ms/step | kernels/step | short | " + " | ".join(columns) + " |",
    "|---|---|---|---|---|---|" + "---|" * len(columns),
  ]
  for r, device in profiled:
    cat = device["ms_per_step_by_category"]
    cells = " | ".join(f"{cat.get(c, 0.0):.1f}" for c in columns)
    short = device.get("short_kernels")
    short = f"{short['per_step']:,.0f} ({short['ms_per_step']:.1f})" if short else ""
    out.append(
      f"| {r['model']} | {r['recipe']} | {r['devices']} | {device['busy_ms_per_step']:.1f} | "
      f"{device['kernels_per_step']:.0f} | {short} | {cells} |"
    )
    base = bf16.get((r["model"], r["devices"]))
    base_device = next(iter((base or {}).get("profile", {}).values()), None)
    if r["recipe"] != "bf16" and base_device and "ms_per_step_by_category" in base_device:
      ref = base_device["ms_per_step_by_category"]
      delta = " | ".join(f"{cat.get(c, 0.0) - ref.get(c, 0.0):+.1f}" for c in columns)
      busy = device["busy_ms_per_step"] - base_device["busy_ms_per_step"]
      kernels = device["kernels_per_step"] - base_device["kernels_per_step"]
      out.append(f"| | Δ bf16 | | {busy:+.1f} | {kernels:+.0f} | | {delta} |")
  return out + _copy_sources(profiled)


def _copy_sources(profiled: list[tuple[dict, dict]], top: int = 4) -> list[str]:
  """Per profiled row whose profile attributes its copy kernels (``copy_sources``), the ``top`` XLA ops behind them."""
  out = []
  for r, device in profiled:
    sources = [s for s in device.get("copy_sources", []) if s[2] >= 0.05][:top]
    if sources:
      ops = ", ".join(f"`{name}` ({calls:.0f} per step, {ms:.1f} ms)" for name, calls, ms in sources)
      out.append(f"- {r['model']} {r['recipe']} on {r['devices']}: {ops}")
  if not out:
    return []
  return ["", f"Copy kernels by XLA op (the {top} largest of at least 0.05 ms per step):", "", *out]


def _linear_trees(doc: dict) -> list[str]:
  n = len(doc["rows"][0]["this_rounds"]) if doc["rows"] else 0
  out = _title(doc, f"One linear layer fwd+bwd, this commit against {doc['baseline_commit']}") + provenance(doc)
  out += [
    "",
    f'X 8192x4096, W 4096x4096, bf16, default arguments (`backend="auto"`), `benchmarks/bench_linear.py` run '
    f"{n} times from each tree, alternately (each round swapping which tree runs first), each run in its own "
    "process on the same GPU. Times are the median over the runs with the range in brackets. The ratio is ACROSS "
    "PROCESSES: the median of this commit's runs over the median of the baseline's; its range pairs the extremes "
    "(fastest over slowest, slowest over fastest).",
    "",
    f"| row | {doc['commit']} ms | {doc['baseline_commit']} ms | ratio | ratio range |",
    "|---|---|---|---|---|",
  ]
  for r in doc["rows"]:
    this, base = r["this_rounds"], r["baseline_rounds"]
    if not base:  # a recipe the baseline does not have
      out.append(f"| {r['name']} | {spread(this, '.3f')} | (not in the baseline) | | |")
      continue
    lo, hi = min(this) / max(base), max(this) / min(base)
    out.append(
      f"| {r['name']} | {spread(this, '.3f')} | {spread(base, '.3f')} | "
      f"{statistics.median(this) / statistics.median(base):.3f} | {lo:.3f}–{hi:.3f} |"
    )
  return out


def _profile_linear(doc: dict) -> list[str]:
  m, k, n = doc["shape"]
  title = f"Where one linear layer's fwd+bwd spends GPU time ({m}x{k} x ({n}x{k})ᵀ, backend {doc['backend']})"
  out = _title(doc, title) + provenance(doc)
  out += [
    "",
    f"One profiled run of {doc['steps']} steps per recipe under the JAX profiler; device busy time and kernel "
    "launches per step, and the kernel that took the most time.",
    "",
    "| recipe | busy ms per step | kernels per step | top kernel (ms per step) |",
    "|---|---|---|---|",
  ]
  for recipe, devices in doc["recipes"].items():
    for s in devices.values():
      name, total, _ = s["top"][0]
      per_step = total / doc["steps"]
      out.append(f"| {recipe} | {s['busy_ms_per_step']:.3f} | {s['kernels_per_step']:.0f} | {name} ({per_step:.3f}) |")
  return out


def _auto_threshold(doc: dict) -> list[str]:
  s = doc["shape"]
  title = f"Quantizer backends, one linear layer fwd+bwd at {s['m']}x{s['k']}x{s['n']}"
  out = _title(doc, title) + provenance(doc)
  out += [
    "",
    f"{doc['dtype']} operands; every row in one process, one run: each time is "
    f"{doc['timing'].split(': ', 1)[-1]}, so there is no range; the ratio is to bf16 in the same process.",
    "",
    "| row | ms | ratio to bf16 |",
    "|---|---|---|",
  ]
  out += [f"| {r['name']} | {r['ms']:.3f} | {r['ratio_to_bf16']:.2f} |" for r in doc["rows"] if "ms" in r]
  return out


def _quant_error(doc: dict) -> list[str]:
  s = doc["settings"]
  out = _title(doc, "Quantization error: Quartet II's table") + provenance(doc)
  out += [
    "",
    f"{s['rows']} rows of 128 N(0,1) values scaled by logspace(2^0…2^8), a 128-point random Hadamard transform "
    f"(except MXFP4), then each quantizer; mean ± sd over {s['keys']} keys. Misalignment is 1 − ⟨x,Q⟩/⟨x,x⟩. "
    "Numerics, not timings: the CPU is a valid device for it.",
    "",
    "| quantizer | rel. MSE ×1e-3 | published | misalignment | published |",
    "|---|---|---|---|---|",
  ]
  for r in doc["rows"]:
    pub, pub_mse = r["published_misalignment"], r["published_rel_mse"]
    out.append(
      f"| {r['name']} | {r['rel_mse'] * 1e3:.2f} ± {r['rel_mse_sd'] * 1e3:.2f} "
      f"| {'—' if pub_mse is None else f'{pub_mse * 1e3:.1f}'} "
      f"| {r['misalignment']:+.5f} ± {r['misalignment_sd']:.5f} | {'—' if pub is None else f'{pub:.4f}'} |"
    )
  return out


def _recipe_errors(doc: dict) -> list[str]:
  s = doc["settings"]
  out = _title(doc, "Recipe accuracy on one SwiGLU MLP") + provenance(doc)
  cols = ("fwd relerr", "cos", "misalign", "misalign(mean16)")
  out += [
    "",
    f"A SwiGLU MLP, {s['tokens']} tokens, width {s['d']}, hidden {s['hidden']}, float32 inputs, every projection "
    "through `fp4jax.einsum` with the recipe; against the exact (bf16 recipe) forward and gradients of the same loss. "
    f"One key, deterministic; the last column is the misalignment of the mean of {s['mean_keys']} keys' gradients "
    "(random recipes). Numerics, not timings.",
    "",
    "| recipe | " + " | ".join(cols) + " |",
    "|---" * (len(cols) + 1) + "|",
  ]
  for r in doc["rows"]:
    out.append(f"| {r['recipe']} | " + " | ".join(f"{r[c]:.4f}" if c in r else "-" for c in cols) + " |")
  return out


def _loss_curves(doc: dict) -> list[str]:
  st = doc["settings"]
  out = _title(doc, f"Loss curves of ModelConfig variants, {st['model']} {st['recipe']}, {st['steps']} steps")
  out += provenance(doc)
  variants = "; ".join(f"`{label}`: {json.dumps(over)}" for label, over in st["variants"].items())
  out += [
    "",
    f"`fp4jax_experiments.train.Trainer`, batch {st['batch']} x {st['seq_len']}, the same data, seed and keys, "
    f"{st['rounds']} runs of each variant (`label#run`) in one process on one device. Variants: {variants}. Two runs "
    "of one variant differ by the device's run-to-run noise only; a variant keeps the curve where its difference "
    "from another is no larger.",
    "",
    "| runs | mean abs difference | largest | at the last step |",
    "|---|---|---|---|",
  ]
  for d in doc["differences"]:
    out.append(f"| {d['a']} vs {d['b']} | {d['mean_abs']:.4f} | {d['max_abs']:.4f} | {d['last']:+.4f} |")
  return out


COMPILE_ONCE, COMPILE_MANY = 6, 2  # the compile's largest host events shown per variant: run once, run many times


def _compile_profile(doc: dict) -> list[str]:
  st = doc["settings"]
  out = _title(doc, f"Where the train step's compile time goes, {st['model']} {st['recipe']}") + provenance(doc)
  out += [
    "",
    "The experiments' train step on one device, traced, lowered and compiled once per variant "
    f"(ModelConfig overrides {json.dumps(st['overrides'])} and the variant's), the compile under the JAX profiler "
    "(`benchmarks/compile_profile.py`; its seconds include the profiler's overhead). Then the compile's largest "
    f"host events: the {COMPILE_ONCE} largest that ran once (XLA's passes and the calls around them; nested events "
    f"count in full) and the {COMPILE_MANY} largest that ran many times (one per kernel module, on parallel compile "
    "threads: their sum can exceed the compile's wall time).",
    "",
    "| variant | trace s | lower s | compile s | optimized HLO lines | custom calls |",
    "|---|---|---|---|---|---|",
  ]
  for label, v in doc["variants"].items():
    out.append(
      f"| {label} | {v['trace_s']:.1f} | {v['lower_s']:.1f} | {v['compile_s']:.1f} | {v['optimized_hlo_lines']:,} "
      f"| {v['custom_calls']} |"
    )
  for label, v in doc["variants"].items():
    once = [e for e in v["host_events"] if e[2] == 1][:COMPILE_ONCE]
    many = [e for e in v["host_events"] if e[2] > 1][:COMPILE_MANY]
    out += ["", f"`{label}`, largest host events:", "", "| event | total s | count |", "|---|---|---|"]
    out += [f"| {name} | {ms / 1e3:.1f} | {n} |" for name, ms, n in once + many]
  return out


def _hlo_census(doc: dict) -> list[str]:
  st = doc["settings"]
  out = _title(doc, f"How large the train step is lowered for a GPU, {st['model']}") + provenance(doc)
  out += [
    "",
    f"The experiments' train step at {st['batch']} x {st['seq_len']} tokens, traced and lowered for CUDA on the "
    "CPU with the dispatch answering as on a GPU that runs the kernels (`benchmarks/hlo_census.py`; no step runs): "
    "StableHLO operations with every call inlined (what XLA's passes start from), JAX's threefry calls and their "
    "share of the operations, the operand quantizations traced as XLA code (a loop body's once) and the Triton "
    "kernel calls of the lowered text. Variants (ModelConfig overrides): "
    + "; ".join(f"`{label}`: {json.dumps(v)}" for label, v in st["variants"].items())
    + ".",
    "",
    "| variant | recipe | operations | threefry calls | threefry share | XLA quantizers | Triton calls |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in doc["rows"]:
    out.append(
      f"| {r['variant']} | {r['recipe']} | {r['inlined_ops']:,} | {r['threefry_calls']} | {r['threefry_share']:.0%} "
      f"| {r['xla_quantizers']} | {r['triton_calls']} |"
    )
  return out


def _kernel_bounds(doc: dict) -> list[str]:
  st = doc["settings"]
  src = st["profile_from"]
  out = _title(doc, f"The train step's Pallas kernels against the GPU's limits, {st['model']}") + provenance(doc)
  out += [
    "",
    f"Every Pallas kernel of each FP4 recipe's step at {st['batch']} x {st['seq_len']} tokens, compiled for sm_90 on "
    "the CPU (`benchmarks/kernel_bounds.py`), per step: launches, the time to issue its SASS instructions at one "
    "warp instruction per scheduler per cycle on an H200 (an estimate: every instruction once per thread), the time "
    f"to move its inputs and outputs once at {st['peak_bytes_per_s'] / 1e12:.1f} TB/s (the H200's peak, a bound), "
    + (
      "and its GPU time in the profile of "
      f"`{src['file']}` ({src['commit']}, {src['device']}; - where not among the profile's 30 longest kernels)."
      if src
      else "(no profile given)."
    ),
    "",
    "| recipe | kernel | launches | SASS per thread | issue ms | memory ms | measured ms | measured / larger |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in doc["rows"]:
    larger = max(r["issue_ms"], r["memory_ms"])
    got = r["measured_ms"]
    sass = "–".join(str(n) for n in (r["sass_per_thread"][0], r["sass_per_thread"][-1])[: len(r["sass_per_thread"])])
    out.append(
      f"| {r['recipe']} | `{r['kernel']}` | {r['launches']} | {sass} | {r['issue_ms']:.2f} | {r['memory_ms']:.2f} | "
      + ("- | - |" if got is None else f"{got:.2f} | {got / larger:.2f} |")
    )
  return out


def _cpu_quantizers(doc: dict) -> list[str]:
  st = doc["settings"]
  out = _title(doc, f"XLA quantizers on the CPU, this commit against {doc['baseline_commit']}") + provenance(doc)
  out += [
    "",
    f'`fp4jax.operand.rotate_and_quantize(..., backend="xla")` under `jax.jit` of a {st["rows"]}x{st["cols"]} '
    f"bfloat16 tensor, the median of {st['repeats']} calls per run, {st['rounds']} runs from each tree in alternating "
    "processes (`benchmarks/cpu_quantizers.py`). Times are the median over the runs with the range in brackets; the "
    "ratio is ACROSS PROCESSES. Same output: every run of both trees gave the same checksum of the quantized outputs.",
    "",
    f"| recipe operand | {doc['commit']} ms | {doc['baseline_commit']} ms | ratio | same output |",
    "|---|---|---|---|---|",
  ]
  for r in doc["rows"]:
    this, base = spread(r["this_rounds"], ".1f"), spread(r["baseline_rounds"], ".1f")
    out.append(f"| {r['name']} | {this} | {base} | {r['ratio']:.3f} | {'yes' if r['same_output'] else 'NO'} |")
  return out


def _occ_bounds(doc: dict) -> list[str]:
  st = doc["settings"]
  methods = list(dict.fromkeys(m for r in doc["rows"] for m in r["ms"]))  # a method absent for a dtype shows "—"
  out = _title(doc, "OCC clamp bounds (ms_fp4's per-row quantiles), several ways") + provenance(doc)
  out += [
    "",
    f"Each row's order statistics at q = {st['quantile']} (`fp4jax.estimators.occ_bounds`: `radix`, XLA's radix "
    "select) and the same bounds by the radix select at other digit widths, a sort, two top-k forms and, where "
    'measured, the Pallas select reading each row once, bfloat16 only (`backend="pallas"`, `"auto"`\'s choice '
    "on a GPU; `benchmarks/occ_bounds.py`), "
    f"each under `jax.jit`, the median ms of {st['repeats']} timed rounds, in one process. Same bounds: equal to "
    "the radix select's bit for bit on a tensor with outliers, signed zeros, ±Inf and NaNs.",
    "",
    "| shape | dtype | " + " | ".join(f"{m} ms" for m in methods) + " | same bounds as radix |",
    "|---|---|" + "---|" * len(methods) + "---|",
  ]
  for r in doc["rows"]:
    same = ", ".join(f"{m} {'yes' if ok else 'NO'}" for m, ok in r["same_as_radix"].items())
    times = " | ".join(f"{r['ms'][m]:.3f}" if m in r["ms"] else "—" for m in methods)
    out.append(f"| {r['rows']}x{r['cols']} | {r['dtype']} | {times} | {same} |")
  return out


def _ablation_table(rows: list[dict]) -> list[str]:
  """A step's variants with and without an op's Pallas implementation: ms per step, tokens/s, time against xla's."""
  base = statistics.median(next(r for r in rows if r["variant"] == "xla")["ms_per_step_rounds"])
  out = [
    "| variant | Pallas calls traced | ms per step (rounds) | tokens/s | step time / xla |",
    "|---|---|---|---|---|",
  ]
  for r in rows:
    ms = r["ms_per_step_rounds"]
    out.append(
      f"| {r['variant']} | {r['pallas_calls_traced']} | {spread(ms, '.1f')} | {r['tokens_per_s']:,.0f} | "
      f"{statistics.median(ms) / base:.3f} |"
    )
  return out


def _pallas_ablation(doc: dict) -> list[str]:
  s = doc["settings"]
  title = f"{s['recipe']}'s {s['model']} step with and without the Pallas {s['op']}"
  out = _title(doc, title) + provenance(doc)
  out += [
    "",
    f"One device, {s['batch']} x {s['seq_len']} tokens: the training step as the library runs it (`pallas`: "
    f'`"auto"` takes the op\'s Pallas implementation where it takes the case) and with that implementation '
    "unregistered (`xla`), compiled in one process and timed in interleaved rounds (`benchmarks/pallas_ablation.py`).",
    "",
  ]
  return out + _ablation_table(doc["rows"])


def _step_bits(doc: dict) -> list[str]:
  s = doc["settings"]
  title = f"Does one compiled step reproduce its losses? {s['recipe']}, {s['model']}"
  out = _title(doc, title) + provenance(doc)
  out += [
    "",
    f"One device, {s['batch']} x {s['seq_len']} tokens, {s['steps']} steps from the same state "
    "(`benchmarks/step_bits.py`): the first step at which two runs' losses differ (none: the same bits throughout), "
    "and their last losses.",
    "",
    "| runs | first differing step | last losses |",
    "|---|---|---|",
  ]
  for pair, first in doc["first_difference"].items():
    last = ", ".join(f"{float.fromhex(doc['losses'][name][-1]):.4f}" for name in pair.split(" / "))
    out.append(f"| {pair} | {'none' if first is None else first} | {last} |")
  return out


def _prepass_sweep(doc: dict) -> list[str]:
  out = _title(doc, "MS-EDEN's staging pre-pass per tile and warps (quartet2's 128-point rotation)") + provenance(doc)
  out += [
    "",
    "`pallas_triton.stage_and_amax` on bf16 tensors of the 125M step, both directions (`rows_of_transpose`: staged "
    "transposed): per shape and direction the default launch (tile of x, warps), the fastest launch that staged "
    "the default's bits, and how many launches ran, failed to compile or staged other bits; GB/s of the launch's "
    "bytes (read x, write the staged tensor), XLA's copy of the tensor for scale "
    "(`benchmarks/kernels_quantize_profile.py --prepass-sweep`).",
    "",
    "| shape | direction | default: tile, warps, ms, GB/s | fastest same-bits: tile, warps, ms, GB/s | / default | "
    "ran / failed / other bits | XLA copy ms |",
    "|---|---|---|---|---|---|---|",
  ]
  groups: dict[tuple, list[dict]] = {}
  for r in doc["rows"]:
    groups.setdefault(("x".join(map(str, r["shape"])), r["along"]), []).append(r)
  launch = lambda r: f"{'x'.join(map(str, r['tile']))}, {r['warps']}, {r['ms']:.3f}, {r['gb_s']:,.0f}"  # noqa: E731
  for (shape, along), rows in groups.items():
    ran = [r for r in rows if "error" not in r]
    same = [r for r in ran if r["same_bits"]]
    if not same:
      out.append(f"| {shape} | {along} | no launch ran | | | 0 / {len(rows)} / 0 | |")
      continue
    best = min(same, key=lambda r: r["ms"])
    counts = f"{len(ran)} / {len(rows) - len(ran)} / {len(ran) - len(same)}"
    out.append(
      f"| {shape} | {along} | {launch(same[0])} | {launch(best)} | {best['vs_default']:.2f} | {counts} | "
      f"{best['copy_ms']:.3f} |"
    )
  return out


def _loop_copies(doc: dict) -> list[str]:
  st = doc["settings"]
  out = _title(doc, f"What the train step's layer loops move, {st['model']} {st['recipe']}") + provenance(doc)
  out += [
    "",
    "Per `while` loop of the compiled step's HLO (`benchmarks/loop_copies.py`; no step runs): the body's copies, "
    "slot writes and reads of stacked buffers that only move data, and the reads and writes XLA does in place, per "
    "iteration, for the six loops that move the most in all their iterations; then the largest groups (kind, "
    "shape, the JAX op they came from) of the loops of more than one iteration.",
    "",
    "| loop | iterations | " + " | ".join(f"{k} (MiB)" for k in _LOOP_KINDS) + " |",
    "|---|---|" + "---|" * len(_LOOP_KINDS),
  ]
  largest = sorted(doc["loops"], key=_loop_bytes, reverse=True)
  for loop in largest[:6]:
    moves = " | ".join(f"{n} ({b / 2**20:.1f})" for n, b in (loop["per_iteration"][k] for k in _LOOP_KINDS))
    out.append(f"| {loop['op_name'] or loop['body']} | {loop['trip_count'] or '?'} | {moves} |")
  for loop in largest[:2]:
    calls = ", ".join(f"{name} ×{n}" for name, n in loop.get("custom_calls", {}).items())
    out += ["", f"Custom calls per iteration of {loop['op_name'] or loop['body']}: {calls or 'none'}."]
    if "kernels" in loop:  # files written before the census counted kernels have none
      by_opcode = collections.Counter()
      for k in loop["kernels"]:
        by_opcode[k["opcode"]] += k["count"]
      most = ", ".join(f"`{k['op'] or '?'}` ×{k['count']}" for k in loop["kernels"][:8])
      out += [
        "",
        f"Kernels per iteration of {loop['op_name'] or loop['body']}: {sum(by_opcode.values())} "
        f"({', '.join(f'{c} {n}' for c, n in sorted(by_opcode.items()))}; by JAX op, `<dot>` any projection's "
        f"quantized dot): {most}.",
      ]
  groups = [(g, loop) for loop in doc["loops"] if (loop["trip_count"] or 0) > 1 for g in loop["groups"]]
  groups.sort(key=lambda gl: -gl[0]["bytes"] * gl[0]["count"])
  out += ["", "| loop | kind | shape | count | MiB each | op |", "|---|---|---|---|---|---|"]
  for g, loop in groups[:8]:
    op = g["op_name"][-90:]
    out.append(
      f"| {loop['op_name'] or loop['body']} | {g['kind']} | {g['shape']} | {g['count']} | "
      f"{g['bytes'] / 2**20:.1f} | `{op}` |"
    )
  return out


_LOOP_KINDS = ("copy", "write", "read", "in place")


def _loop_bytes(loop: dict) -> float:
  """Bytes a loop's body moves in all its iterations (an unknown trip count counts once)."""
  return (loop["trip_count"] or 1) * sum(b for _, b in loop["per_iteration"].values())


RENDER: dict[str, Callable[[dict], list[str]]] = {
  "loop_copies": _loop_copies,
  "train_throughput": _train_throughput,
  "compile_profile": _compile_profile,
  "hlo_census": _hlo_census,
  "kernel_bounds": _kernel_bounds,
  "linear_trees": _linear_trees,
  "profile_linear": _profile_linear,
  "auto_threshold": _auto_threshold,
  "quant_error": _quant_error,
  "recipe_errors": _recipe_errors,
  "loss_curves": _loss_curves,
  "cpu_quantizers": _cpu_quantizers,
  "occ_bounds": _occ_bounds,
  "pallas_ablation": _pallas_ablation,
  "prepass_sweep": _prepass_sweep,
  "step_bits": _step_bits,
}

INTRO = [
  "# Benchmarks",
  "",
  "<!-- Generated by `python benchmarks/report.py` from benchmarks/results/*.json. Do not edit by hand: "
  "tests/benchmarks/test_report.py checks that this file is what the script writes. -->",
  "",
  "The current numbers, one section per result file under `benchmarks/results/`, each with the device, JAX "
  "version, commit, date and the command that reproduces it. Where a file holds several rounds the table gives the "
  "range; a ratio says whether both sides ran in the same process. A section marked STALE was measured on older "
  "code and says why. How the numbers got here (earlier runs, reverted experiments) is in CHANGELOG.md.",
  "",
  "Regenerate after adding or replacing a result file: `python benchmarks/report.py`.",
  "",
  "The LM-training loss gaps to BF16 (the sweep) and their scaling-law fit are in "
  "[experiments/results/README.md](experiments/results/README.md), with the command and commit of every run.",
]


def load(results: pathlib.Path = RESULTS) -> list[dict]:
  """The result documents, in report order (``ORDER``, then file name)."""
  docs = [(path.name, json.loads(path.read_text())) for path in sorted(results.glob("*.json"))]
  unknown = sorted(name for name, doc in docs if doc.get("benchmark") not in RENDER)
  if unknown:
    raise ValueError(f"{results}: no renderer for {unknown} (their 'benchmark' field must be one of {ORDER})")
  return [doc for _, doc in sorted(docs, key=lambda nd: (ORDER.index(nd[1]["benchmark"]), nd[0]))]


def section(doc: dict) -> list[str]:
  """``doc``'s section: its renderer's lines, or for a stale result only its heading, reason (with
  ``STALE_TABLES``), note and provenance."""
  lines = RENDER[doc["benchmark"]](doc)
  if "stale" not in doc:
    return lines
  end = next(i for i, line in enumerate(lines) if line.startswith("Reproduce: "))
  return lines[: end + 1]


def render(docs: list[dict]) -> str:
  """The whole of BENCHMARKS.md for ``docs``."""
  lines = list(INTRO)
  for doc in docs:
    lines += [""] + section(doc)
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--check", action="store_true", help="only compare BENCHMARKS.md with what would be written")
  args = p.parse_args(argv)
  text, path = render(load()), ROOT / "BENCHMARKS.md"
  if args.check:
    same = path.exists() and path.read_text() == text
    print("BENCHMARKS.md is up to date" if same else "BENCHMARKS.md differs: run python benchmarks/report.py")
    return 0 if same else 1
  path.write_text(text)
  print(f"wrote {path} ({text.count(chr(10))} lines)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
