"""Where the fused quantize kernel's time goes: stage ablations on the GPU, and instruction counts from its Triton IR.

    python benchmarks/kernels_quantize_profile.py            # GPU: stage timings vs a copy
    python benchmarks/kernels_quantize_profile.py --ir       # any machine: Triton IR op counts
    python benchmarks/kernels_quantize_profile.py --ptx      # any machine: PTX, SASS counts (and the pair kernels')
    python benchmarks/kernels_quantize_profile.py --prepass-sweep --out prepass.json  # GPU: the pre-pass's tiles

Stages (each a Pallas kernel over the same bf16 tensor and tile, timed next to XLA's copy):
``copy`` (load, store bf16: Pallas's own ceiling), ``block_amax`` (+ per-16-block max|x|, stored as fp32),
``hash`` (the SR bits of every element, top byte stored), ``fwht16`` (the 16-point Hadamard of the kernel, bf16
stored), ``transpose`` (load, transpose in registers, store), then the full kernels with the tensor amax given
(no pre-pass). A quantize at copy bandwidth is memory-bound; a stage far below it is ALU- or layout-bound.

``--ir`` counts, per spec, the operations of the kernel's Triton IR that act on whole-tile tensors (elementwise
arithmetic, per element of the tile) and the layout operations (reshape, transpose, split, join, broadcast):
the per-element instruction budget a memory-bound kernel must stay under is roughly
(ALU rate / copy bandwidth) · bytes per element.

``--ptx`` then counts the kernels as a training step launches them, at the 125M step's 16384 x 2048 shape: the pair
kernels (``PAIRS``: one tensor quantized for two GEMMs, ``fp4jax.operand.rotate_and_quantize_both`` under ``"auto"``
as on a GPU that runs the kernels) and MS-EDEN's staging pre-pass (quartet2's 128-point rotation, both directions):
SASS instructions per element of each launch (grid programs x warps x 32 threads x its straight-line instructions /
elements), barriers per thread, and ``issue_us``, the least time they take at one warp instruction per scheduler per
cycle on an H200 (132 SMs x 4 schedulers at 1.98 GHz).

``--prepass-sweep`` times MS-EDEN's staging pre-pass (``pallas_triton.stage_and_amax``: quartet2's 128-point
rotation, both directions) on the 125M step's bf16 shapes for each ``PREPASS_CONFIGS`` tile and warp count, each
checked to stage the default launch's bits, beside XLA's copy of the same tensor; ``--out`` writes the rows as JSON
(``benchmarks/report.py`` section ``prepass_sweep``).
"""

from __future__ import annotations

import argparse
import collections
import functools
import math
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import kernels_quantize as bench  # benchmarks/ is on sys.path when this script runs
import numpy as np
from benchtools import command_line, commit, header, provenance, time_ms, write_json
from fp4jax_kernels import triton_ir
from fp4jax_kernels.quantize import pallas_triton
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

import fp4jax
from fp4jax._src import backends, operand
from fp4jax._src import bits as bits_lib

LAYOUT_OPS = ("tt.reshape", "tt.trans", "tt.split", "tt.join", "tt.broadcast", "tt.expand_dims", "tt.reduce")


def _stage(body, out_cols, out_dtype, tile, num_warps, transpose: bool = False):
  """A kernel over (rows, cols) bf16 ``x`` in ``tile`` blocks whose program writes ``body(x_tile)`` (``transpose``:
  the transposed tile, into the transposed output)."""

  def kernel(x_ref, o_ref):
    y = body(x_ref[...])
    o_ref[...] = y.T if transpose else y

  def run(x):
    (m, k), (bm, bk) = x.shape, tile
    if transpose:
      out_block, out_index, out_shape = (out_cols(bk), bm), (lambda i, j: (j, i)), (out_cols(k), m)
    else:
      out_block, out_index, out_shape = (bm, out_cols(bk)), (lambda i, j: (i, j)), (m, out_cols(k))
    return pl.pallas_call(
      kernel,
      grid=(m // bm, k // bk),
      in_specs=[pl.BlockSpec(tile, lambda i, j: (i, j))],
      out_specs=pl.BlockSpec(out_block, out_index),
      out_shape=jax.ShapeDtypeStruct(out_shape, out_dtype),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
    )(x)

  return jax.jit(run)


def _block_amax(x):
  r, c = x.shape
  return jnp.max(jnp.abs(x.astype(jnp.float32)).reshape(r, c // 16, 16), axis=-1)


def _hash(x):
  """``fp4jax.bits.hash_bits`` of every element's index, its seed written as constants (a kernel captures none)."""
  r, c = x.shape
  idx = lax.broadcasted_iota(jnp.int32, (r, c), 0) * c + lax.broadcasted_iota(jnp.int32, (r, c), 1)
  h = bits_lib.fmix32(idx.astype(jnp.uint32) * jnp.uint32(0x9E3779B9) + jnp.uint32(12345))
  return (bits_lib.fmix32(h ^ jnp.uint32(678)) >> 24).astype(jnp.uint8)


def _fwht16(x):
  return pallas_triton.rotate_rows(x.astype(jnp.float32), 16, None, True).astype(jnp.bfloat16)


STAGES = {  # name: (body, output columns from input columns, output dtype)
  "copy": (lambda x: x, lambda k: k, jnp.bfloat16),
  "block_amax": (_block_amax, lambda k: k // 16, jnp.float32),
  "hash": (_hash, lambda k: k, jnp.uint8),
  "fwht16": (_fwht16, lambda k: k, jnp.bfloat16),
}
FULL = {  # the kernels themselves as (spec, output), tensor amax given (no pre-pass)
  "nvfp4_rtn_1x16": bench.make_case(fp4jax.NVFP4),
  "nvfp4_rtn_values": bench.make_case(fp4jax.NVFP4, dequantize="block_scaled_only"),
  "nvfp4_rtn_values_only": bench.make_case(fp4jax.NVFP4, dequantize="block_scaled_only", packed=False),
  "nvfp4_sr_1x16": bench.make_case(fp4jax.NVFP4, rounding="sr"),
  "nvfp4_rht16_sr": bench.make_case(fp4jax.NVFP4, rounding="sr", hadamard=16, signs="te"),
  "nvfp4_ms_eden_rht128": bench.make_case(fp4jax.NVFP4, rounding="eden", hadamard=128, signs="random"),
  "nvfp4_rtn_cols": bench.make_case(fp4jax.NVFP4, along="cols"),
}
TILES = (((16, 256), 4), ((64, 256), 8))
PAIRS = {  # (recipe, rows operand, cols operand): the pairs of nvidia_nvfp4's step (X; dY, both SR)
  "nvidia_nvfp4_x_pair": ("nvidia_nvfp4", "fwd_lhs", "wgrad_rhs"),
  "nvidia_nvfp4_dy_pair": ("nvidia_nvfp4", "dgrad_lhs", "wgrad_lhs"),
}
PREPASS_SHAPES = ((16384, 2048), (16384, 768))  # the 125M step's dY / SwiGLU product and X / dY of q, k, v, o
PREPASS_CONFIGS = {  # direction: (tile of x, warps) to try; the first is the default (prepass_tile, prepass_num_warps)
  "rows": [(t, w) for t in ((16, 256), (32, 256), (64, 256), (128, 256), (16, 512)) for w in (4, 8)],
  "rows_of_transpose": [(t, w) for t in ((128, 32), (256, 32), (128, 64), (256, 16), (512, 16)) for w in (8, 4)],
}
H200_ISSUE_RATE = 132 * 4 * 1.98e9
REPO = pathlib.Path(__file__).resolve().parents[1]  # warp instructions per second: SMs x schedulers x clock


def timings(x: jax.Array, tiles=TILES) -> None:
  copy_ms, copy_bw = bench.copy_bandwidth(x)
  print(f"shape {x.shape} bf16; XLA copy {copy_ms:.3f} ms = {copy_bw:.0f} GB/s (read + write)")
  print(f"{'stage':24s} {'tile':>12s} {'ms':>8s} {'x copy time':>12s}")
  key, amax = jax.random.key(1), jnp.float32(5.0)

  def show(name, tile, nw, f, *args):
    try:
      ms = time_ms(f, *args)
      print(f"{name:24s} {f'{tile} w{nw}':>12s} {ms:8.3f} {ms / copy_ms:11.2f}x", flush=True)
    except Exception as e:  # noqa: BLE001  a stage that fails to compile is reported, not fatal
      print(f"{name:24s} {f'{tile} w{nw}':>12s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)

  for tile, nw in tiles:
    for name, (body, cols, dtype) in STAGES.items():
      show(name, tile, nw, _stage(body, cols, dtype, tile, nw), x)
    show("transpose", tile, nw, _stage(lambda x: x, lambda k: k, jnp.bfloat16, tile, nw, transpose=True), x)
    for name, (spec, output) in FULL.items():
      t = tile[::-1] if output.transposed else tile
      f = jax.jit(functools.partial(pallas_triton.quantize, spec=spec, output=output, tile=t, num_warps=nw, amax=amax))
      show(name, t, nw, lambda x, key, f=f: f(x, key=key), x, key)


def kernel_ir(case: tuple, shape=(256, 1024), tile=None) -> str:
  """Triton IR of the kernel of ``case = (spec, output)`` (NVFP4: the tensor amax given, so only the main
  kernel)."""
  spec, output = case
  amax = jnp.float32(1.0) if spec.fmt.has_tensor_scale else None
  fn = lambda x, key: pallas_triton.quantize(x, spec, key, output=output, tile=tile, amax=amax)
  (text,) = triton_ir.triton_modules(fn, jnp.ones(shape, jnp.bfloat16), jax.random.key(0))
  return text


def ir_counts(case: tuple, shape=(256, 1024), tile=None) -> dict:
  """Operation counts of the Triton IR of the kernel of ``case = (spec, output)``."""
  tile = tile or pallas_triton.default_tile(*case)
  text = kernel_ir(case, shape, tile)
  elems = tile[0] * tile[1]
  per_element, layout = 0.0, collections.Counter()
  for line in text.splitlines():
    m = re.search(r"= (\w+\.\w+)", line)
    if not m:
      continue
    op = m.group(1)
    if op in LAYOUT_OPS:
      layout[op] += 1
      continue
    if not op.startswith(("arith.", "math.", "tt.extern", "tt.elementwise_inline_asm")) or "arith.constant" in op:
      continue
    result = re.findall(r"-> tensor<([0-9x]+)x\w+>|: tensor<([0-9x]+)x\w+>\s*$", line)
    dims = next((a or b for a, b in result), None)
    if dims:
      n = 1
      for d in dims.split("x"):
        n *= int(d)
      per_element += n / elems
  return {"ops_per_element": round(per_element, 1), "layout_ops": dict(layout)}


def ptx_counts(case: tuple, shape=(256, 1024), tile=None, num_warps: int | None = None) -> dict:
  """The kernel of ``case = (spec, output)`` compiled for sm_90 by PyPI's Triton (``fp4jax_kernels.triton_ir``, a
  proxy): PTX and SASS instructions per element of each thread, barriers, shared-memory loads and stores, and the
  layout conversions of its TTGIR."""
  tile = tile or pallas_triton.default_tile(*case)
  num_warps = num_warps or pallas_triton.default_num_warps(case[0])  # the kernel's own (Triton IR does not carry it)
  compiled = triton_ir.compile_sm90(kernel_ir(case, shape, tile), num_warps)
  ops = triton_ir.ptx_opcodes(compiled)
  count = lambda prefix: sum(op.startswith(prefix) for op in ops)  # noqa: E731
  per_thread = tile[0] * tile[1] / (32 * num_warps)
  return {
    "ptx_per_element": round(len(ops) / per_thread, 1),
    "sass_per_element": round(sum(triton_ir.sass_histogram(compiled).values()) / per_thread, 1),
    "bar": count("bar."),
    "st.shared": count("st.shared"),
    "ld.shared": count("ld.shared"),
    "convert_layout": compiled.asm["ttgir"].count("ttg.convert_layout"),
    "shared_bytes": compiled.metadata.shared,
  }


def pair_sass_counts(recipe: str, rows: str, cols: str, shape=(16384, 2048)) -> dict[str, dict]:
  """Per kernel launch of the pair of ``recipe``'s operands ``rows`` and ``cols`` (``PAIRS``) on a bf16 ``shape``:
  SASS instructions per element and the issue-bound µs (module docstring)."""
  r = fp4jax.recipes.get(recipe)
  (spec_r, spec_c), keys = (getattr(r, rows), getattr(r, cols)), jax.random.split(jax.random.key(0), 4)
  pair = lambda x: operand.rotate_and_quantize_both(  # noqa: E731
    x, (spec_r, keys[0], spec_r.sign_vector(keys[1])), (spec_c, keys[2], spec_c.sign_vector(keys[3]))
  )
  return launch_sass_counts(pair, jnp.ones(shape, jnp.bfloat16))


def prepass_sass_counts(along: str, shape=(16384, 2048)) -> dict[str, dict]:
  """``launch_sass_counts`` of MS-EDEN's staging pre-pass (``stage_and_amax``, default launch) on a bf16 ``shape``,
  ``along`` ``"rows"`` or ``"rows_of_transpose"``, with its barriers per thread."""
  spec, output = bench.make_case(fp4jax.NVFP4, rounding="eden", hadamard=128, signs="random", along=along)
  signs = jnp.ones((128,), jnp.float32)
  stage = lambda x: pallas_triton.stage_and_amax(x, spec, output, signs)  # noqa: E731
  return launch_sass_counts(stage, jnp.ones(shape, jnp.bfloat16))


def launch_sass_counts(fn, x: jax.Array) -> dict[str, dict]:
  """Per Pallas kernel that ``fn(x)`` launches as on a GPU that runs the kernels, compiled for sm_90: SASS
  instructions per element of ``x`` (grid programs x warps x 32 threads x its straight-line instructions /
  elements), barriers per thread, and ``issue_us`` at ``H200_ISSUE_RATE``."""
  out = {}
  for r in launch_records(fn, x):
    out[r["name"]] = {
      "sass_per_element": round(32 * r["warp_instructions"] / x.size, 1),
      "barriers_per_thread": r["barriers_per_thread"],
      "issue_us": round(1e6 * r["warp_instructions"] / H200_ISSUE_RATE, 1),
    }
  return out


def _pallas_launches(jaxpr) -> list[tuple]:
  """``(pallas_call equation, launches per run of jaxpr)`` (``triton_ir.counted_equations``)."""
  return [(eqn, n) for eqn, n in triton_ir.counted_equations(jaxpr) if eqn.primitive.name == "pallas_call"]


def _bind(eqn, *xs):
  return eqn.primitive.bind(*xs, **eqn.params)


def _structs(variables) -> list[jax.ShapeDtypeStruct]:
  return [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in variables]


def launch_records(fn, *args) -> list[dict]:
  """One record per Pallas kernel call in ``fn(*args)`` traced and lowered for CUDA as on a GPU that runs the kernels
  (its module compiled for sm_90, each distinct module once): ``name``, ``times`` (launches per run of ``fn``: a layer
  loop's body runs once per iteration), ``warp_instructions`` of one launch (grid programs x warps x straight-line
  SASS instructions), ``sass_per_thread``, ``barriers_per_thread`` and ``bytes`` (every input and output once).

  Raises:
    RuntimeError: a kernel call lowered as a module of another name.
  """
  backends.load_plugins()
  saved = backends.has_pallas_triton, backends.pallas_interpret
  backends.has_pallas_triton, backends.pallas_interpret = (lambda device=None: True), (lambda device=None: False)
  try:
    calls = _pallas_launches(jax.make_jaxpr(fn)(*args).jaxpr)
    # each call lowered alone (lowering a whole program lowers identical kernels once)
    modules = [triton_ir.triton_modules(functools.partial(_bind, eqn), *_structs(eqn.invars)) for eqn, _ in calls]
  finally:
    backends.has_pallas_triton, backends.pallas_interpret = saved
  compiled: dict[tuple[str, int], collections.Counter] = {}
  records = []
  for (eqn, times), found in zip(calls, modules):
    (module,) = found
    if re.search(r"tt\.func public @(\w+)", module).group(1) != eqn.params["name"]:
      raise RuntimeError(f"the kernel {eqn.params['name']} lowered as another module")
    warps = eqn.params["compiler_params"].num_warps
    if (module, warps) not in compiled:
      compiled[module, warps] = triton_ir.sass_histogram(triton_ir.compile_sm90(module, warps))
    sass = compiled[module, warps]
    avals = [v.aval for v in (*eqn.invars, *eqn.outvars)]
    records.append(
      {
        "name": eqn.params["name"],
        "times": times,
        "warp_instructions": math.prod(eqn.params["grid_mapping"].grid) * warps * sum(sass.values()),
        "sass_per_thread": sum(sass.values()),
        "barriers_per_thread": sass.get("BAR", 0),
        "bytes": sum(a.size * a.dtype.itemsize for a in avals),
      }
    )
  return records


def prepass_sweep() -> list[dict]:
  """One row per shape, direction and ``PREPASS_CONFIGS`` launch of MS-EDEN's staging pre-pass (module docstring):
  ms per call, its bytes' GB/s (read x, write the staged tensor), the ratio to the default launch, and whether it
  staged the default's bits (a launch that fails to compile is reported with its error)."""
  signs = fp4jax.hadamard.random_signs(jax.random.key(1), 128)
  rows = []
  for shape in PREPASS_SHAPES:
    x = jax.random.normal(jax.random.key(0), shape, jnp.float32).astype(jnp.bfloat16)
    copy_ms, _ = bench.copy_bandwidth(x)
    for along, configs in PREPASS_CONFIGS.items():
      spec, output = bench.make_case(fp4jax.NVFP4, rounding="eden", hadamard=128, signs="random", along=along)
      default = None
      for tile, warps in configs:
        row = {"shape": list(shape), "along": along, "tile": list(tile), "warps": warps, "copy_ms": copy_ms}
        f = jax.jit(
          functools.partial(
            pallas_triton.stage_and_amax,
            spec=spec,
            output=output,
            signs=signs,
            tile=tile,
            num_warps=warps,
            interpret=backends.pallas_interpret(),
          )
        )
        try:
          got = jax.block_until_ready(f(x))
          row["ms"] = time_ms(f, x)
        except Exception as e:  # noqa: BLE001  a launch that fails to compile is reported, not fatal
          rows.append(row | {"error": f"{type(e).__name__}: {str(e)[:200]}"})
          continue
        default = default or (got, row["ms"])
        row["same_bits"] = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, default[0]))
        row["gb_s"] = 2 * x.size * x.dtype.itemsize / row["ms"] / 1e6
        row["vs_default"] = row["ms"] / default[1]
        rows.append(row)
        print(
          f"{shape} {along:18s} {tile} w{warps}: {row['ms']:.3f} ms, {row['gb_s']:.0f} GB/s, "
          f"{row['vs_default']:.2f} of the default, same bits {row['same_bits']}",
          flush=True,
        )
  return rows


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--rows", type=int, default=16384)
  p.add_argument("--cols", type=int, default=8192)
  p.add_argument("--ir", action="store_true", help="Triton IR operation counts per spec (no GPU needed)")
  p.add_argument("--ptx", action="store_true", help="PTX counts from PyPI's Triton, a proxy (no GPU needed)")
  p.add_argument("--quick", action="store_true", help="only the first tile configuration")
  p.add_argument("--prepass-sweep", action="store_true", help="GPU: MS-EDEN's staging pre-pass per tile and warps")
  p.add_argument("--out", default=None, help="--prepass-sweep: the JSON to write")
  p.add_argument("--commit", default=None, help="--prepass-sweep: default git rev-parse of this checkout")
  args = p.parse_args()
  if args.prepass_sweep:
    command = command_line("benchmarks/kernels_quantize_profile.py", sys.argv[1:])
    doc = {
      "benchmark": "prepass_sweep",
      **provenance(args.commit or commit(), command),
      "rows": prepass_sweep(),
    }
    if args.out:
      write_json(args.out, doc)
    return
  if args.ir or args.ptx:
    for name, case in FULL.items():
      print(f"{name:24s} {ptx_counts(case) if args.ptx else ir_counts(case)}", flush=True)
    if args.ptx:
      for name, pair in PAIRS.items():
        print(f"{name:24s} {pair_sass_counts(*pair)}", flush=True)
      for along in ("rows", "rows_of_transpose"):
        print(f"{'ms_eden_prepass_' + along:24s} {prepass_sass_counts(along)}", flush=True)
    return
  print(header())
  x = jax.random.normal(jax.random.key(0), (args.rows, args.cols), jnp.float32).astype(jnp.bfloat16)
  timings(x, TILES[:1] if args.quick else TILES)


if __name__ == "__main__":
  main()
