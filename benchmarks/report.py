"""Regenerates the "Current numbers" section at the top of BENCHMARKS.md from benchmarks/results/*.json.

    python benchmarks/report.py

The section lies between two marker lines; everything below the end marker is left as it is.
"""

from __future__ import annotations

import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- current numbers: begin (benchmarks/report.py) -->", "<!-- current numbers: end -->"


def _linear_trees(doc: dict) -> list[str]:
  out = [
    f"### Linear layer fwd+bwd, default arguments, this tree / {doc['baseline_commit']}",
    "",
    f"{doc['header']}; commit {doc['commit']}; `{doc['command']}`",
    "",
    "| row | this ms | baseline ms | this / baseline |",
    "|---|---|---|---|",
  ]
  out += [f"| {r['name']} | {r['this_ms']:.3f} | {r['baseline_ms']:.3f} | {r['ratio']:.3f} |" for r in doc["rows"]]
  return out


def _auto_threshold(doc: dict) -> list[str]:
  s = doc["shape"]
  out = [
    f"### Quantizer backends at {s['m']}x{s['k']}x{s['n']} (ratio to bf16 in the same run)",
    "",
    f"{doc['header']}; commit {doc['commit']}; `{doc['command']}`; {doc.get('note', '')}",
    "",
    "| row | ms | ratio to bf16 |",
    "|---|---|---|",
  ]
  out += [f"| {r['name']} | {r['ms']:.3f} | {r['ratio_to_bf16']:.2f} |" for r in doc["rows"] if "ms" in r]
  return out


def _train_throughput(doc: dict) -> list[str]:
  s = doc["settings"]
  title = (
    f"### Training throughput, {s['model']}, {s['per_device_batch']} x {s['seq_len']} tokens per device "
    "(experiments model and plain-JAX anchor, one run)"
  )
  where = (
    f"{doc['header']}; commit {doc['commit']}; `{doc['command']}`; MFU against the measured bf16 GEMM rate "
    f"({doc['matmul_tflops']:.0f} TFLOP/s); anchor attention {s['anchor_attention']}"
    + ("" if doc.get("complete", True) else "; INCOMPLETE: the run stopped before its last device count")
  )
  out = [
    title,
    "",
    where,
    "",
    "| model | recipe | devices | tokens/s | ms/step | MFU | / anchor | weak scaling | compile s |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  fmt = lambda x, spec: "" if x is None else format(x, spec)
  for r in doc["rows"]:
    head = f"| {r['model']} | {r['recipe']} | {r['devices']} |"
    if "error" in r:
      out.append(f"{head} failed: {r['error'][:100].replace('|', '/')} | | | | | |")
      continue
    eff = fmt(r["scaling_efficiency"], ".1%") if r["devices"] > 1 else ""
    out.append(
      f"{head} {r['tokens_per_s']:,.0f} | {r['step_time_median_s'] * 1e3:.1f} | {r['mfu']:.1%} | "
      f"{fmt(r['ratio_to_anchor'], '.2f')} | {eff} | {r['compile_s']:.0f} |"
    )
  return out


def _profile_linear(doc: dict) -> list[str]:
  m, k, n = doc["shape"]
  out = [
    f"### Where one linear layer's fwd+bwd spends GPU time ({m}x{k} x ({n}x{k})ᵀ, backend {doc['backend']})",
    "",
    f"{doc['header']}; commit {doc['commit']}; `{doc['command']}`",
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


RENDER = {
  "profile_linear": _profile_linear,
  "linear_trees": _linear_trees,
  "auto_threshold": _auto_threshold,
  "train_throughput": _train_throughput,
}


def section() -> str:
  lines = [
    BEGIN,
    "## Current numbers",
    "",
    "Generated from `benchmarks/results/*.json` by `python benchmarks/report.py`.",
    "",
  ]
  for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
    doc = json.loads(path.read_text())
    lines += RENDER[doc["benchmark"]](doc) + [""]
  return "\n".join(lines + [END])


def main() -> None:
  path = ROOT / "BENCHMARKS.md"
  text = path.read_text()
  rest = text.split(END, 1)[1].lstrip("\n") if END in text else text
  head = text.split(BEGIN, 1)[0] if BEGIN in text else ""
  path.write_text(head + section() + "\n\n" + rest)


if __name__ == "__main__":
  main()
