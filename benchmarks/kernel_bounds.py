"""How far each FP4 recipe's Pallas kernels in the 125M train step run from two limits of the GPU (any machine;
a GPU profile supplies the measured side).

    python benchmarks/kernel_bounds.py --recipes nvidia_nvfp4,quartet2,quartet,ms_fp4 \
        --out benchmarks/results/kernel_bounds_125M.json

Each recipe's step (``fp4jax_experiments.train.Trainer``, ``--batch`` x ``--seq-len`` tokens, its default
configuration as on a GPU that runs the kernels: ``hlo_census.as_gpu``) is traced and lowered for CUDA on this
machine; every Pallas kernel it launches (a layer loop's once per iteration) is compiled for sm_90 by PyPI's Triton
(``kernels_quantize_profile.launch_records``). Per kernel, summed over the launches of one step:

* ``issue_ms``: the time to issue the compiled kernel's instructions at one warp instruction per scheduler per cycle
  on an H200 (grid programs x warps x the kernel's SASS instructions / ``H200_ISSUE_RATE``). An estimate, not a
  bound: every instruction counts once per thread, so a slow path or tail that most threads skip counts fully (the
  estimate is then high) and a loop's body once (then low);
* ``memory_ms``: the least time to read each input once and write each output once at the H200's peak memory
  bandwidth (``H200_PEAK_BYTES_PER_S``, NVIDIA's 4.8 TB/s), a bound;
* ``measured_ms``: its GPU time per step in ``--profile-from``'s profile of the same recipe (a
  ``train_throughput.py`` result; None where the kernel is not among the profile's 30 longest).

A kernel whose measured time is near the larger of the two is at that limit; one far above both loses its time
elsewhere (barriers, latency, occupancy).
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import sys

if __package__ in (None, ""):  # run as a script: benchmarks/ and the repository root importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchtools import command_line, commit, provenance, write_json
from kernels_quantize_profile import H200_ISSUE_RATE, launch_records

import fp4jax
from benchmarks import hlo_census

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
H200_PEAK_BYTES_PER_S = 4.8e12  # HBM3e, NVIDIA's H200 datasheet


def measured(profile_doc: dict | None, recipe: str) -> dict[str, float]:
  """GPU ms per step by kernel (XLA's ``__N`` suffixes merged) for ``recipe``'s experiments row of a
  ``train_throughput`` result, from its profile's longest kernels."""
  if profile_doc is None:
    return {}
  for row in profile_doc["rows"]:
    if row["model"] == "experiments" and row["recipe"] == recipe and row.get("profile"):
      (device,) = row["profile"].values()
      steps = device["busy_ms"] / device["busy_ms_per_step"]
      out: dict[str, float] = collections.Counter()
      for name, ms, _ in device["top"]:
        out[re.sub(r"__\d+$", "", name)] += ms / steps
      return dict(out)
  return {}


def kernel_rows(recipe: str, model: str, batch: int, seq_len: int, profile_doc) -> list[dict]:
  """One row per Pallas kernel of ``recipe``'s step (module docstring)."""
  step, args = hlo_census.step_and_args(model, recipe, {}, batch, seq_len)
  records = launch_records(step, *args)
  totals: dict[str, dict] = {}
  for r in records:
    t = totals.setdefault(r["name"], {"launches": 0, "warp_instructions": 0, "bytes": 0, "sass": set()})
    t["launches"] += r["times"]
    t["warp_instructions"] += r["times"] * r["warp_instructions"]
    t["bytes"] += r["times"] * r["bytes"]
    t["sass"].add(r["sass_per_thread"])
  got = measured(profile_doc, recipe)
  rows = []
  for name, t in totals.items():
    issue_ms, memory_ms = 1e3 * t["warp_instructions"] / H200_ISSUE_RATE, 1e3 * t["bytes"] / H200_PEAK_BYTES_PER_S
    rows.append(
      {
        "recipe": recipe,
        "kernel": name,
        "launches": t["launches"],
        "sass_per_thread": sorted(t["sass"]),
        "issue_ms": issue_ms,
        "memory_ms": memory_ms,
        "limit": "issue" if issue_ms >= memory_ms else "memory",
        "measured_ms": got.get(name),
      }
    )
  return sorted(rows, key=lambda r: -max(r["issue_ms"], r["memory_ms"]))


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--recipes", default="nvidia_nvfp4,quartet2,quartet,ms_fp4", help="comma-separated recipe names")
  p.add_argument("--model", default="125M")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq-len", type=int, default=1024)
  p.add_argument(
    "--profile-from",
    default=str(RESULTS / "train_throughput_125M_defaults.json"),
    help="a train_throughput.py result whose profile gives the measured times ('' for none)",
  )
  p.add_argument("--commit", default=None)
  p.add_argument("--out", default=None, help="write the rows as JSON here")
  args = p.parse_args(argv)
  recipes = args.recipes.split(",")
  unknown = [r for r in recipes if r not in fp4jax.recipes.names()]
  if unknown:
    p.error(f"--recipes: unknown recipe(s) {unknown}; known: {', '.join(fp4jax.recipes.names())}")
  profile_path = pathlib.Path(args.profile_from) if args.profile_from else None
  if profile_path is not None and not profile_path.is_file():
    p.error(f"--profile-from: no file {profile_path} (a train_throughput.py result; '' for none)")
  profile_doc = json.loads(profile_path.read_text()) if profile_path else None
  hlo_census.as_gpu()
  rows = []
  for recipe in recipes:
    got = kernel_rows(recipe, args.model, args.batch, args.seq_len, profile_doc)
    for r in got:
      measured_ms = "-" if r["measured_ms"] is None else f"{r['measured_ms']:.2f}"
      print(
        f"{recipe:14s} {r['kernel']:28s} x{r['launches']:<4d} issue {r['issue_ms']:6.2f} ms  memory "
        f"{r['memory_ms']:6.2f} ms  measured {measured_ms} ms",
        flush=True,
      )
    rows += got
  doc = {
    "benchmark": "kernel_bounds",
    **provenance(args.commit or commit(), command_line("benchmarks/kernel_bounds.py", argv or sys.argv[1:])),
    "settings": {
      "model": args.model,
      "batch": args.batch,
      "seq_len": args.seq_len,
      "peak_bytes_per_s": H200_PEAK_BYTES_PER_S,
      "profile_from": None
      if profile_doc is None
      else {"file": profile_path.name, "commit": profile_doc["commit"], "device": profile_doc["device_kind"]},
      "issue_rate": H200_ISSUE_RATE,
    },
    "rows": rows,
  }
  if args.out:
    write_json(args.out, doc)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
