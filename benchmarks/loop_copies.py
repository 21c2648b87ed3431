"""What the experiments' train step moves into and out of its layer loops' stacked buffers, from the compiled HLO.

  python benchmarks/loop_copies.py --recipe nvidia_nvfp4                       # GPU: the 125M step
  XLA_FLAGS=--xla_gpu_enable_dynamic_slice_fusion=true python benchmarks/loop_copies.py --recipe nvidia_nvfp4
  python benchmarks/loop_copies.py --model 100K --batch 2 --seq-len 64 --out /tmp/c.json   # CPU smoke

The FP4 blocks run one per iteration of a device loop (``--overrides``' default ``{"scan_unroll": 1}``: without it
nvidia_nvfp4's stack is unrolled, ``ModelConfig.scan_unroll="auto"``): the forward loop writes each
activation the backward needs into a stacked buffer (one slot per layer, a ``dynamic-update-slice``) and the
backward loop reads it back (a ``dynamic-slice``). The GPU profile of the 125M step shows ``memcpy`` kernels
(BENCHMARKS.md's copy column). This census compiles ``fp4jax_experiments.train.Trainer``'s train step once (no
step runs) and lists, per ``while`` loop of the optimized HLO, the instructions of its body, and of the computations
the body calls (``body_instructions``), that move a whole value:
- ``copy`` (non-scalar);
- "write": a fusion that only moves data (parameters, bitcasts, reshapes, scalar index arithmetic) whose root is
  ``dynamic-update-slice`` (bytes of one slot: the buffer's bytes over its leading dimension);
- "read": such a fusion holding a ``dynamic-slice`` (bytes of the fusion's output);
- "in place": fusions XLA compiled as address computations (``dynamic_address_computation``: a kernel reading or
  writing the slot in place, no copy);
grouped by kind, shape and the JAX op they came from (``op_name`` metadata); and the body's custom calls by kernel
name (a tensor quantized once for several GEMMs, its kernel CSE'd by XLA, counts once).
Writes the JSON to ``--out`` (default benchmarks/results/loop_copies.json).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import math
import os
import pathlib
import re
import sys

if __package__ in (None, ""):  # run as a script: the repository root makes ``benchmarks`` importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


from benchmarks import compile_profile
from benchmarks.benchtools import command_line, commit, header, provenance, write_json

REPO = pathlib.Path(__file__).resolve().parents[1]
KINDS = ("copy", "write", "read", "in place")
_HEADER = re.compile(r"^(?:ENTRY )?%(\S+) \(")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\S+?)(?:\{[^}]*\})? ([\w-]+)\(")
_LAUNCH = re.compile(r"^\s*(?:ROOT )?%\S+ = .*? (fusion|custom-call|copy)\(")  # any shape, a tuple's too
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f4e2m1fn": 0.5, "s4": 0.5, "u4": 0.5}


def shape_bytes(shape: str) -> float:
  """Bytes of an HLO array shape such as ``bf16[16384,768]`` (a tuple or token: 0)."""
  m = re.fullmatch(r"([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]", shape)
  if m is None:
    return 0.0
  dtype, dims = m.groups()
  size = _DTYPE_BYTES.get(dtype) or int(re.search(r"\d+", dtype).group()) // 8
  return size * math.prod(int(d) for d in dims.split(",") if d)


def computations(hlo: str) -> dict[str, list[str]]:
  """The HLO module's computations: name -> the lines of its body."""
  out, name = {}, None
  for line in hlo.splitlines():
    m = _HEADER.match(line)
    if m and line.rstrip().endswith("{"):
      name = m.group(1)
      out[name] = []
    elif line.startswith("}"):
      name = None
    elif name is not None:
      out[name].append(line)
  return out


def _op_name(line: str) -> str:
  m = re.search(r'op_name="([^"]*)"', line)
  return re.sub(r"^jit\([^)]*\)/", "", m.group(1)) if m else ""


def census(hlo: str) -> list[dict]:
  """Per ``while`` loop of an optimized HLO module's text: its ``body``, ``op_name``, ``trip_count`` (XLA's known
  trip count, else None) and ``groups``: ``{kind, shape, op_name, count, bytes}`` per (kind, shape, op_name) of the
  body's value moves (``KINDS``; ``bytes`` per instance), most bytes first, with ``per_iteration`` totals
  ``{kind: [count, bytes]}``, ``custom_calls``: the body's custom calls (Pallas kernels by their name, others by
  their target) and how many of each, so that a kernel quantizing one tensor for several GEMMs shows once, and
  ``kernels``: the body's kernel launches per iteration (fusions, custom calls, non-scalar copies) as
  ``{opcode, op, count}`` per JAX op they came from (``op_source``), most first."""
  comps = computations(hlo)
  roots = {name: next((line for line in lines if "ROOT " in line), "") for name, lines in comps.items()}
  loops = []
  for lines in comps.values():
    for line in lines:
      if " while(" not in line or "body=%" not in line:
        continue
      body = re.search(r"body=%([\w.\-]+)", line).group(1)
      trip = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', line)
      insts = body_instructions(body, comps)
      groups = collections.Counter()
      calls = collections.Counter(_call_name(inst) for inst in insts if " custom-call(" in inst)
      for inst in insts:
        move = _classify(inst, comps, roots)
        if move is not None:
          groups[move] += 1
      kernels = collections.Counter(k for k in map(_kernel, insts) if k is not None)
      rows = [{"kind": k, "shape": s, "op_name": o, "count": n, "bytes": b} for (k, s, o, b), n in groups.items()]
      rows.sort(key=lambda r: (-r["bytes"] * r["count"], r["kind"], r["op_name"]))
      totals = {k: [0, 0.0] for k in KINDS}
      for r in rows:
        totals[r["kind"]][0] += r["count"]
        totals[r["kind"]][1] += r["count"] * r["bytes"]
      loops.append(
        {
          "body": body,
          "op_name": _op_name(line),
          "trip_count": int(trip.group(1)) if trip else None,
          "per_iteration": totals,
          "groups": rows,
          "custom_calls": dict(sorted(calls.items())),
          "kernels": [{"opcode": c, "op": o, "count": n} for (c, o), n in kernels.most_common()],
        }
      )
  return loops


# a call or async start (after its shape, which may be a tuple) and the computation it runs
_CALLED = re.compile(r"[\]})] (?:call|async-start)\(.*?\b(?:to_apply|calls)=%([\w.\-]+)")


def body_instructions(body: str, comps: dict[str, list[str]]) -> list[str]:
  """The instructions of computation ``body`` and, recursively, of the computations it runs through ``call`` or
  ``async-start``: XLA:GPU outlines runs of a loop body's instructions into such calls (its command buffers, run as
  CUDA graphs), so the body's own lines may hold none of its copies. Fusions' computations are not entered (a fusion
  is one kernel, classified whole), nor nested loops (each loop is reported on its own)."""
  out, todo, seen = [], [body], set()
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    seen.add(name)
    for line in comps.get(name, []):
      m = _CALLED.search(line)
      if m:
        todo.append(m.group(1))
      else:
        out.append(line)
  return out


def op_source(op_name: str) -> str:
  """The JAX op an instruction came from, the same for every layer and projection: ``op_name`` without the path to
  the loop body (``.../while/body/``, ``eval_jaxpr/``), and a module path ending in a ``DotGeneral_N`` (one
  projection's quantized dot, e.g. ``blocks/attn/q/DotGeneral_0``) as ``<dot>``."""
  op = re.sub(r"^.*/while/body/", "", op_name)
  op = re.sub(r"^eval_jaxpr/", "", op)
  return re.sub(r"(?:(?<=/)|^)(?:[\w.\-]+/)*DotGeneral_\d+(?=/|$)", "<dot>", op)


def _kernel(line: str) -> tuple[str, str] | None:
  """``(opcode, op_source)`` of a body instruction that launches a kernel of its own (a fusion, a custom call, a
  copy of more than a scalar), else None."""
  m = _LAUNCH.match(line)  # a multi-output fusion or a Pallas call has a tuple shape, which _INSTRUCTION skips
  if m is None or (m.group(1) == "copy" and shape_bytes(_INSTRUCTION.match(line).group(2)) <= 8):
    return None
  return m.group(1), op_source(_op_name(line))


def _call_name(line: str) -> str:
  """A custom call's kernel name (a Pallas kernel's ``name`` in its backend config), else its target."""
  m = re.search(r'\bname\\?"?\s*[:=]\s*\\?"([\w.\-]+)', line) or re.search(r'custom_call_target="([^"]+)"', line)
  return m.group(1) if m else "?"


def _classify(line: str, comps: dict[str, list[str]], roots: dict[str, str]) -> tuple | None:
  """``(kind, shape, op_name, bytes)`` of a body instruction that moves a whole value, else None."""
  m = _INSTRUCTION.match(line)
  if m is None:
    return None
  _, shape, opcode = m.groups()
  if opcode == "copy":
    return None if shape_bytes(shape) <= 8 else ("copy", shape, _op_name(line), shape_bytes(shape))
  if opcode != "fusion":
    return None
  called = re.search(r"calls=%([\w.\-]+)", line).group(1)
  if "address_computation" in line:
    return ("in place", shape, _op_name(line), shape_bytes(shape))
  body = comps.get(called, [])
  if not all(_moves_only(inner) for inner in body):
    return None  # the slice is fused with arithmetic on whole arrays: no separate pass over memory
  if " dynamic-update-slice(" in roots.get(called, ""):
    lead = re.search(r"\[(\d+)", shape)
    slot = shape_bytes(shape) / int(lead.group(1)) if lead and int(lead.group(1)) else 0.0
    return ("write", shape, _op_name(line), slot)
  if any(" dynamic-slice(" in inner for inner in body):
    return ("read", shape, _op_name(line), shape_bytes(shape))
  return None


_MOVE_OPS = {"parameter", "constant", "bitcast", "reshape", "copy", "dynamic-slice", "dynamic-update-slice", "tuple"}


def _moves_only(line: str) -> bool:
  """Whether a fused computation's instruction only moves data or computes a scalar (an index)."""
  m = _INSTRUCTION.match(line)
  return m is None or m.group(3) in _MOVE_OPS or "[]" in m.group(2)


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", default="125M")
  p.add_argument("--recipe", default="nvidia_nvfp4")
  p.add_argument(
    "--overrides", default='{"scan_unroll": 1}', type=json.loads, help="JSON ModelConfig overrides (default: the loop)"
  )
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq-len", type=int, default=1024)
  p.add_argument("--top", type=int, default=12, help="groups kept per loop (the most bytes)")
  p.add_argument("--commit", default=None)
  p.add_argument("--hlo-out", default=None, help="also write the compiled HLO text here, gzipped (a .gz path)")
  p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "loop_copies.json"))
  args = p.parse_args(argv)
  if args.top < 1:
    p.error(f"--top must be >= 1, got {args.top}")
  step, step_args = compile_profile.train_step(args.model, args.recipe, args.overrides, args.seq_len, args.batch)
  hlo = step.lower(*step_args).compile().as_text() or ""
  if args.hlo_out:
    with gzip.open(args.hlo_out, "wt") as f:  # the kernels' fusion names in a profile, looked up in their module
      f.write(hlo)
  loops = census(hlo)
  for loop in loops:
    loop["groups"] = loop["groups"][: args.top]
    if sum(b for _, b in loop["per_iteration"].values()) < 2**10:
      continue  # the printout skips the loops that move less than 1 KiB per iteration (the JSON keeps them)
    moves = ", ".join(f"{k} {n} ({b / 2**20:.1f} MiB)" for k, (n, b) in loop["per_iteration"].items() if n)
    print(f"{loop['op_name'] or loop['body']} x{loop['trip_count']}: {moves or 'no moves'}", flush=True)
  xla_flags = os.environ.get("XLA_FLAGS", "")
  command = command_line("benchmarks/loop_copies.py", sys.argv[1:] if argv is None else argv, xla_flags)
  doc = {
    "benchmark": "loop_copies",
    "header": header(),
    **provenance(args.commit or commit(), command),
    "xla_flags": xla_flags,
    "settings": {k: getattr(args, k) for k in ("model", "recipe", "overrides", "batch", "seq_len")},
    "loops": loops,
  }
  write_json(args.out, doc)
  return 0


if __name__ == "__main__":
  sys.exit(main())
