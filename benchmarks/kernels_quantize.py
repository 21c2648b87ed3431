"""Quantize kernels vs a device-to-device copy of the same tensor (and the pure-JAX path), one run, one table.

    python benchmarks/kernels_quantize.py [--rows 16384 --cols 8192]
    python benchmarks/kernels_quantize.py --sweep-tiles [--json sweep.json]
    python benchmarks/kernels_quantize.py --after-producer
    python benchmarks/kernels_quantize.py --pairs [--rows 8192 --cols 4096]

"% copy BW" = (bytes the op must move at least: read x once + write codes and scales) / time, over the copy's
(read + write) / time. The Pallas rows include the amax pre-pass (a second read of x, see pallas_triton; with a
Hadamard it also writes the rotated x the kernel reads); "kernel only" subtracts the separately timed pre-pass.

``--after-producer``: NVFP4 RTN in a graph, after the elementwise op that produces ``x`` (``PRODUCERS``): what the
quantize adds to the producer's time, against the kernel alone (tensor amax given) and the standalone quantize. XLA
can fold the amax pre-pass into the producer's fusion (a multi-output fusion that writes ``x`` and its partial
maxima), so in a model the quantize costs about the kernel alone; whether it did is read from the compiled HLO.

``--pairs``: one tensor quantized both ways (``PAIRS``: a linear layer's X and dY as ``fp4jax.operand`` asks for
them, bf16 values only), by the two ``quantize`` calls (default tiles and routes) and by ``quantize_pair`` over
``PAIR_TILES`` x ``SWEEP_WARPS``; "% copy BW" counts one read of x and both outputs.

``--sweep-tiles``: for every spec, the kernel over ``SWEEP_TILES`` x ``SWEEP_WARPS`` (tiles given as (across,
along) the quantized axis; a tile the spec cannot take is skipped, one that fails to compile is reported), next to
the copy; prints one JSON document (also written to ``--json``) with every config and the best one per spec as a
fraction of copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import re

import jax
import jax.numpy as jnp
from benchtools import header, time_ms
from fp4jax_kernels.quantize import pallas_triton
from fp4jax_kernels.quantize.output import KernelOutput

import fp4jax


def make_case(fmt, *, along="rows", dequantize=None, trust_mask=False, packed=True, **quantizer) -> tuple:
  """One kernel call's ``(quantizer, outputs)``: ``fp4jax.QuantizeSpec(fmt, **quantizer)`` and its
  ``KernelOutput``."""
  return fp4jax.QuantizeSpec(fmt, **quantizer), KernelOutput(along, dequantize, trust_mask, packed)


OPS = {  # name: ((spec, output), tiles to try as (tile, num_warps))
  "nvfp4_rtn_1x16": (
    make_case(fp4jax.NVFP4),
    [((16, 256), 4), ((32, 256), 4), ((64, 256), 4), ((64, 256), 8), ((16, 512), 4), ((16, 256), 2)],
  ),
  "nvfp4_rht16_sr": (
    make_case(fp4jax.NVFP4, rounding="sr", hadamard=16, signs="te"),
    [((16, 256), 4), ((32, 256), 8)],
  ),
  "nvfp4_ms_eden_rht128": (
    make_case(fp4jax.NVFP4, rounding="eden", hadamard=128, signs="random"),
    [((16, 256), 4), ((32, 128), 4)],
  ),
  "mxfp4_rtn_1x32": (make_case(fp4jax.MXFP4), [((16, 256), 4)]),
  "nvfp4_rtn_cols": (make_case(fp4jax.NVFP4, along="cols"), [((256, 32), 4), ((128, 64), 4), ((256, 64), 8)]),
  # What fp4jax.dot_general(backend="pallas") runs: bf16 values out (the GEMM operand), wgrad operands transposed.
  "nvfp4_rtn_values": (make_case(fp4jax.NVFP4, dequantize="block_scaled_only"), [((16, 256), 4), ((32, 256), 4)]),
  "nvfp4_rht16_sr_values_wgrad": (
    make_case(
      fp4jax.NVFP4,
      rounding="sr",
      hadamard=16,
      signs="te",
      along="rows_of_transpose",
      dequantize="block_scaled_only",
    ),
    [((256, 32), 4), ((256, 64), 8)],
  ),
  # ... and without the packed codes and scales, as fp4jax.operand asks for them (packed=False)
  "nvfp4_rtn_values_only": (make_case(fp4jax.NVFP4, dequantize="block_scaled_only", packed=False), [((16, 256), 4)]),
  "nvfp4_rht16_sr_values_only_wgrad": (
    make_case(
      fp4jax.NVFP4,
      rounding="sr",
      hadamard=16,
      signs="te",
      along="rows_of_transpose",
      dequantize="block_scaled_only",
      packed=False,
    ),
    [((256, 32), 4)],
  ),
}
_VALUES = dict(dequantize="block_scaled_only", packed=False)
_RHT16_TE = dict(hadamard=16, signs="te")
PAIRS = {  # name: (along the rows, transposed), as fp4jax.dot_general's kernels quantize these tensors
  "nvidia_nvfp4 X": (
    make_case(fp4jax.NVFP4, **_VALUES),
    make_case(fp4jax.NVFP4, along="rows_of_transpose", **_RHT16_TE, **_VALUES),
  ),
  "nvidia_nvfp4 dY": (
    make_case(fp4jax.NVFP4, rounding="sr", **_VALUES),
    make_case(fp4jax.NVFP4, rounding="sr", along="rows_of_transpose", **_RHT16_TE, **_VALUES),
  ),
  "nvfp4_rtn X, dY": (
    make_case(fp4jax.NVFP4, **_VALUES),
    make_case(fp4jax.NVFP4, along="rows_of_transpose", **_VALUES),
  ),
  "quartet dY": (
    make_case(fp4jax.MXFP4, rounding="sr", hadamard=32, signs="random", **_VALUES),
    make_case(fp4jax.MXFP4, rounding="sr", hadamard=32, signs="random", along="rows_of_transpose", **_VALUES),
  ),
}
PAIR_TILES = ((16, 256), (32, 128), (32, 256), (64, 64), (64, 128), (128, 64))  # tiles of x
SWEEP_TILES = ((16, 256), (32, 256), (64, 256), (32, 512), (64, 512), (128, 256))  # (across, along)
SWEEP_WARPS = (4, 8)


def min_bytes(case: tuple, n: int) -> int:
  """Bytes a quantize of ``n`` bf16 elements must move: read x once, write the codes and the block scales (if
  ``output.packed``) and the optional outputs (bf16 dequantized, uint8 trust mask)."""
  spec, output = case
  packed = n // 2 + n // spec.fmt.block_size if output.packed else 0
  return 2 * n + packed + (2 * n if output.dequantize else 0) + (n if output.trust_mask else 0)


def copy_bandwidth(x: jax.Array) -> tuple[float, float]:
  """(ms, GB/s read + write) of the faster of a copy and a negation of ``x``: the device-to-device ceiling."""
  ms = min(time_ms(jax.jit(lambda x: jnp.array(x, copy=True)), x), time_ms(jax.jit(lambda x: -x), x))
  return ms, 2 * x.size * x.dtype.itemsize / ms / 1e6


def prepass_ms(case: tuple, x: jax.Array, interpret: bool) -> float:
  """Time of the pre-pass that ``case``'s default route runs (NVFP4 only; 0 for MXFP4, which has no tensor scale):
  the amax reduction, or the one that also stages the kernel's input (route ``"prepass"``)."""
  spec, output = case
  if not spec.fmt.has_tensor_scale:
    return 0.0
  signs = fp4jax.hadamard.TE_SIGNS_16 if spec.signs == "te" else None
  if pallas_triton.prepass_stages(spec, output):
    return time_ms(jax.jit(lambda x: pallas_triton.stage_and_amax(x, spec, output, signs, interpret=interpret)), x)
  return time_ms(jax.jit(lambda x: pallas_triton.tensor_amax(x, spec, output, signs, interpret=interpret)), x)


def kernel_fn(case: tuple, tile, num_warps: int, interpret: bool):
  spec, output = case
  return jax.jit(
    lambda x, key: pallas_triton.quantize(
      x, spec, key, output=output, tile=tile, num_warps=num_warps, interpret=interpret
    )
  )


def sweep(x: jax.Array, key: jax.Array, copy_bw: float, interpret: bool = False) -> dict:
  """Every (tile, warps) per spec: ms, fraction of copy bandwidth (with and without the pre-pass), or why not."""
  results = {}
  for name, (case, _) in OPS.items():
    frac = lambda ms, case=case: (min_bytes(case, x.size) / ms / 1e6) / copy_bw
    pre = prepass_ms(case, x, interpret)
    configs = []
    for across, along in SWEEP_TILES:
      tile = (along, across) if case[1].transposed else (across, along)
      for nw in SWEEP_WARPS:
        row = {"tile": list(tile), "num_warps": nw}
        f = kernel_fn(case, tile, nw, interpret)
        try:
          f.trace(x, key)
        except ValueError as e:  # the tile does not hold whole blocks / Hadamard chunks of this spec
          configs.append({**row, "skipped": str(e)})
          continue
        try:
          ms = time_ms(f, x, key)
        except Exception as e:  # noqa: BLE001  a config that fails to compile or run is reported, not fatal
          configs.append({**row, "failed": f"{type(e).__name__}: {str(e)[:200]}"})
          continue
        configs.append(
          {**row, "ms": ms, "frac_copy_bw": frac(ms), "kernel_only_frac_copy_bw": frac(ms - pre) if ms > pre else None}
        )
        print(f"{name:24s} tile {tile} w{nw}: {ms:.3f} ms, {100 * frac(ms):.1f}% of copy BW", flush=True)
    timed = [c for c in configs if "ms" in c]
    best = min(timed, key=lambda c: c["ms"]) if timed else None
    results[name] = {"spec": repr(case), "amax_prepass_ms": pre, "best": best, "configs": configs}
  return results


def other_routes(case: tuple) -> list[str]:
  """The routes of ``pallas_triton.quantize`` other than the default that run differently for ``case``: without a
  transpose, ``"xla"`` and ``"kernel"`` are one route; without a transpose or a rotation all three are."""
  spec, output = case
  routes = list(pallas_triton.ROUTES) if output.transposed else ["kernel", "prepass"] if spec.hadamard else []
  return [r for r in routes if r != pallas_triton.default_route(spec)]


def table(x: jax.Array, key: jax.Array, copy_bw: float, interpret: bool = False) -> None:
  """The hand-picked tiles of ``OPS`` next to the XLA path, one text table."""
  n = x.size
  print(f"{'op':24s} {'impl':28s} {'ms':>8s} {'% copy BW':>10s} {'kernel-only ms':>15s}")
  for name, (case, tiles) in OPS.items():
    spec, output = case
    pct = lambda ms, case=case: 100 * (min_bytes(case, n) / ms / 1e6) / copy_bw
    signs = fp4jax.hadamard.TE_SIGNS_16 if spec.signs == "te" else None
    pre = prepass_ms(case, x, interpret)
    if spec.hadamard:
      xla_pre = time_ms(jax.jit(lambda x: pallas_triton.tensor_amax(x, spec, output, signs, use_kernel=False)), x)
      print(f"{name:24s} {'amax pre-pass, xla hadamard':28s} {xla_pre:8.3f}", flush=True)
    for tile, nw in tiles:
      try:
        ms = time_ms(kernel_fn(case, tile, nw, interpret), x, key)
        print(f"{name:24s} {f'pallas {tile} w{nw}':28s} {ms:8.3f} {pct(ms):9.1f}% {ms - pre:15.3f}", flush=True)
      except Exception as e:  # noqa: BLE001  a tile that fails to compile is reported, not fatal
        print(f"{name:24s} {f'pallas {tile} w{nw}':28s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
    for route in other_routes(case):  # the pallas rows above take pallas_triton.default_route(spec)
      fn = jax.jit(
        lambda x, key, route=route: pallas_triton.quantize(
          x, spec, key, output=output, interpret=interpret, route=route
        )
      )
      ms = time_ms(fn, x, key)
      print(f"{name:24s} {f'pallas, route {route}':28s} {ms:8.3f} {pct(ms):9.1f}%", flush=True)
    axis, xt = (0 if output.along == "cols" else -1), output.along == "rows_of_transpose"
    for impl, fn in (("xla fp4jax.quantize", fp4jax.quantize), ("xla fp4jax.fake_quantize", fp4jax.fake_quantize)):
      ms = time_ms(jax.jit(lambda x, key, fn=fn: fn(x.T if xt else x, spec, key=key, axis=axis)), x, key)
      print(f"{name:24s} {impl:28s} {ms:8.3f} {pct(ms):9.1f}% {'':>15s}", flush=True)
    print(f"{name:24s} {'pre-pass (used)':28s} {pre:8.3f}", flush=True)


def pair_bytes(rows: tuple, cols: tuple, n: int) -> int:
  """Bytes ``quantize_pair`` must move for ``n`` bf16 elements: read x once, write both directions' outputs."""
  return 2 * n + sum(min_bytes(s, n) - 2 * n for s in (rows, cols))


def pairs(x: jax.Array, key: jax.Array, copy_bw: float, interpret: bool = False) -> None:
  """Per ``PAIRS`` entry: the two quantizes, then ``quantize_pair`` on every tile and warp count (ms, % of copy
  bandwidth for one read of x and both outputs, speed-up over the two quantizes)."""
  k1, k2 = jax.random.split(key)
  print(f"{'tensor':18s} {'impl':32s} {'ms':>8s} {'% copy BW':>10s} {'vs two':>7s}")
  for name, (rows, cols) in PAIRS.items():
    need = pair_bytes(rows, cols, x.size)
    outputs = dict(rows_output=rows[1], cols_output=cols[1])
    pct = lambda ms: 100 * (need / ms / 1e6) / copy_bw
    two = jax.jit(
      lambda x, a, b: (
        pallas_triton.quantize(x, rows[0], a, output=rows[1], interpret=interpret).dequantized,
        pallas_triton.quantize(x, cols[0], b, output=cols[1], interpret=interpret).dequantized,
      )
    )
    t_two = time_ms(two, x, k1, k2)
    print(f"{name:18s} {'two quantizes (defaults)':32s} {t_two:8.3f} {pct(t_two):9.1f}%", flush=True)
    for tile in PAIR_TILES:
      for nw in SWEEP_WARPS:
        fn = jax.jit(
          lambda x, a, b, tile=tile, nw=nw: [
            q.dequantized
            for q in pallas_triton.quantize_pair(
              x, rows[0], cols[0], a, b, **outputs, tile=tile, num_warps=nw, interpret=interpret
            )
          ]
        )
        label = f"pair {tile} w{nw}"
        try:
          ms = time_ms(fn, x, k1, k2)
        except Exception as e:  # noqa: BLE001  a tile that fails to compile is reported, not fatal
          print(f"{name:18s} {label:32s} FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)
          continue
        print(f"{name:18s} {label:32s} {ms:8.3f} {pct(ms):9.1f}% {t_two / ms:6.2f}x", flush=True)


PRODUCERS = {  # name: the elementwise op that produces x from two bf16 tensors (a SwiGLU-like product, a residual add)
  "x = h * g": lambda h, g: h * g,
  "x = h + g": lambda h, g: h + g,
  "x = gelu(h)": lambda h, g: jax.nn.gelu(h),
}
IN_GRAPH_OPS = ("nvfp4_rtn_1x16", "nvfp4_rtn_values_only")
IN_GRAPH_PAIRS = ("nvfp4_rtn X, dY", "nvidia_nvfp4 X")


def amax_folded(fn, *args) -> bool:
  """Whether XLA compiled ``fn`` with one fusion that writes a tensor of ``args[0]``'s shape together with other
  outputs (the producer's result and the amax's partial reduction: the pre-pass folded into the producer)."""
  hlo_type = {"bfloat16": "bf16", "float32": "f32"}[jnp.dtype(args[0].dtype).name]
  shape = f"{hlo_type}[{','.join(map(str, args[0].shape))}]"
  entry = fn.lower(*args).compile().as_text().split("ENTRY")[-1]
  return any(re.search(r"= \([^=]*" + re.escape(shape) + r"[^=]*\) fusion\(", line) for line in entry.splitlines())


def after_producer(h: jax.Array, copy_bw: float, interpret: bool = False) -> None:
  """One row per (op, producer): producer alone, producer + quantize, what the quantize adds (and its share of
  copy bandwidth by ``min_bytes``), the kernel alone (tensor amax given; single quantizes only) and the standalone
  quantize with its pre-pass. The ops: ``IN_GRAPH_OPS``, then the pairs of ``IN_GRAPH_PAIRS``."""
  g = jax.random.normal(jax.random.key(2), h.shape, jnp.float32).astype(h.dtype)
  print(
    f"{'op':24s} {'producer':14s} {'producer':>9s} {'+ quantize':>11s} {'adds':>7s} {'% copy BW':>10s} "
    f"{'kernel alone':>13s} {'standalone':>11s} amax folded into the producer"
  )
  outs = lambda q: (q.dequantized,) if q.qtensor is None else (q.qtensor.codes, q.qtensor.scales)
  ops = {}  # name: (quantize(x, **kw) -> outputs, bytes, takes amax=)
  for name in IN_GRAPH_OPS:
    spec, output = case = OPS[name][0]
    ops[name] = (
      lambda x, spec=spec, output=output, **kw: outs(
        pallas_triton.quantize(x, spec, output=output, interpret=interpret, **kw)
      ),
      min_bytes(case, h.size),
      True,
    )
  for name in IN_GRAPH_PAIRS:
    rows, cols = PAIRS[name]
    pair = lambda x, rows=rows, cols=cols: [
      o
      for q in pallas_triton.quantize_pair(
        x, rows[0], cols[0], rows_output=rows[1], cols_output=cols[1], interpret=interpret
      )
      for o in outs(q)
    ]
    ops[f"pair: {name}"] = (pair, pair_bytes(rows, cols, h.size), False)
  for name, (quantize, need, takes_amax) in ops.items():
    for label, prod in PRODUCERS.items():
      f_prod = jax.jit(prod)
      f_both = jax.jit(lambda h, g, prod=prod, quantize=quantize: (prod(h, g), *quantize(prod(h, g))))
      x = f_prod(h, g)
      t_prod, t_both = time_ms(f_prod, h, g), time_ms(f_both, h, g)
      t_kernel = "–"
      if takes_amax:
        amax = jnp.max(jnp.abs(x.astype(jnp.float32)))
        t_kernel = f"{time_ms(jax.jit(lambda x, a, quantize=quantize: quantize(x, amax=a)), x, amax):.3f}"
      t_alone = time_ms(jax.jit(quantize), x)
      added = t_both - t_prod
      pct = 100 * (need / added / 1e6) / copy_bw if added > 0 else float("nan")
      print(
        f"{name:24s} {label:14s} {t_prod:9.3f} {t_both:11.3f} {added:7.3f} {pct:9.1f}% {t_kernel:>13s} "
        f"{t_alone:11.3f} {amax_folded(f_both, h, g)}",
        flush=True,
      )


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--rows", type=int, default=16384)
  p.add_argument("--cols", type=int, default=8192)
  p.add_argument("--sweep-tiles", action="store_true", help="tile x num_warps sweep per spec, JSON out")
  p.add_argument("--json", default=None, help="with --sweep-tiles: also write the JSON document to this path")
  p.add_argument("--after-producer", action="store_true", help="NVFP4 RTN after an elementwise producer, in one graph")
  p.add_argument("--pairs", action="store_true", help="both directions of one tensor: two quantizes vs the pair")
  p.add_argument("--interpret", action="store_true", help="Pallas interpret mode: a CPU smoke run, times meaningless")
  args = p.parse_args()
  m, k = args.rows, args.cols
  x = jax.random.normal(jax.random.key(0), (m, k), jnp.float32).astype(jnp.bfloat16)
  key = jax.random.key(1)
  print(header())
  copy_ms, copy_bw = copy_bandwidth(x)
  print(f"shape {m}x{k} bf16; copy {copy_ms:.3f} ms = {copy_bw:.0f} GB/s (read + write)")
  if args.after_producer:
    after_producer(x, copy_bw, args.interpret)
    return
  if args.pairs:
    pairs(x, key, copy_bw, args.interpret)
    return
  if not args.sweep_tiles:
    table(x, key, copy_bw, args.interpret)
    return
  doc = {
    "header": header(),
    "shape": [m, k],
    "dtype": "bfloat16",
    "copy_ms": copy_ms,
    "copy_GBps": copy_bw,
    "bytes_rule": "read x once + codes + block scales + optional outputs (bf16 x)",
    "specs": sweep(x, key, copy_bw, args.interpret),
  }
  text = json.dumps(doc, indent=1)
  print(text)
  if args.json:
    with open(args.json, "w") as f:
      f.write(text + "\n")
  for name, r in doc["specs"].items():
    b = r["best"]
    print(
      f"best {name:24s} "
      + (
        "none ran"
        if b is None
        else f"tile {tuple(b['tile'])} w{b['num_warps']}: {b['ms']:.3f} ms, {100 * b['frac_copy_bw']:.1f}% of copy BW"
      )
    )


if __name__ == "__main__":
  main()
