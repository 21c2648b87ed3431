"""Fused FP4 quantize kernel, Pallas on the Triton backend (GPU; interpret mode on CPU).

One program reads one (block_rows, block_cols) tile of ``x`` once and writes packed E2M1 codes (even element in
the low nibble), block-scale bit patterns (uint8; bitcast to float8 outside) and, as its ``KernelOutput`` asks, the
dequantized tile (with or without the tensor scale) and QuEST's trust mask. Fused in the tile: the blockwise
Hadamard (TE, random or caller-given signs), the per-element random bits (``fp4jax.bits.hash_bits`` of the element's
logical index: the reference's bits) and the block numerics, which are the foundation's own ``quantize_blocks``
evaluated in the kernel, so every rounding and scale rule of ``fp4jax.quantize`` holds bit for bit. Transposed
directions write K-major; ``route`` says where the transposition and rotation happen (in the kernel, by XLA's
transpose, or in the amax pre-pass). Each thread holds whole blocks (or Hadamard chunks of up to 32 elements) in
registers (``load_units``, ``load_rotated``; the pre-pass's larger chunks along the rows, ``rotate_vector_parts``,
in parts of 8 contiguous elements). NVFP4's tensor amax is a separate reduction before the kernel
(``tensor_amax``): current scaling must see every element before the first code is final. The kernel takes that
amax, computes the tensor scales from it in every program (``fmt.tensor_scales``: two divisions, PTX ``div.rn.f32``)
and writes the decode scale for the GEMM, so XLA runs none of the exact division's integer arithmetic around it.
Bytes moved per element:
2·sizeof(x) + 1/2 (codes) + 1/16 (scales), + 2 (bf16 dequantized) and 1 (trust mask) when asked for; the
``"prepass"`` route adds 2·sizeof(x) (the staged input) to rotate once instead of twice. ``quantize_pair`` quantizes
a tensor along its rows and, transposed, its columns in one pre-pass and one kernel, reading ``x`` twice, not four
times.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from fp4jax._src import backends, estimators, sharding
from fp4jax._src import bits as bits_lib
from fp4jax._src import hadamard as hadamard_lib
from fp4jax._src.formats import F32_INF_BITS
from fp4jax._src.ieee import widen
from fp4jax._src.quantize import (
  BlockLayout,
  QTensor,
  block_dims,
  check_quantize_input,
  decode_blocks,
  needs_quantize_key,
  quantize_blocks,
)
from fp4jax._src.rounding import rtn_bf16
from fp4jax._src.spec import QuantizeSpec
from fp4jax_kernels.edge_blocks import load_in_bounds, store_in_bounds
from fp4jax_kernels.quantize import output as output_lib
from fp4jax_kernels.quantize.output import KernelOutput, Quantized
from fp4jax_kernels.triton_compat import kernel_safe


# ------------------------------------------------------------------------------------------------ in-kernel pieces
def rotate_rows(x: jax.Array, d: int, signs: jax.Array | None, round_bf16: bool) -> jax.Array:
  """``fp4jax.hadamard.hadamard(x, d, axis=-1, signs)`` of a 2D tile, then one bf16 rounding for bf16 inputs."""
  r, c = x.shape
  x3 = x.reshape(r, c // d, d)
  if signs is not None:
    x3 = x3 * signs.reshape(1, 1, d)
  y = (hadamard_lib.fwht(x3, d) * jnp.float32(1.0 / math.sqrt(d))).reshape(r, c)
  return rtn_bf16(y) if round_bf16 else y


MAX_UNIT = 32  # MS-EDEN's 128-point chunks in one thread would spill registers


def rotates_in_parts(spec: QuantizeSpec) -> bool:
  """Whether ``spec``'s Hadamard runs on ``load_rotated``'s parts (in the pre-pass, and in the kernel for the
  transposed directions): up to ``MAX_UNIT`` points. Larger Hadamards use the tile load (128 scalar parts compile
  slowly), but for the pre-pass along the rows, which loads them in vector parts (``rotates_in_vector_parts``)."""
  return 0 < spec.hadamard <= MAX_UNIT


VECTOR_PART = 8  # a chunk's contiguous elements that rotate_vector_parts loads as one part (16 bytes of bf16)


def rotates_in_vector_parts(spec: QuantizeSpec, output: KernelOutput) -> bool:
  """Whether the pre-pass rotates ``spec``'s Hadamard in contiguous parts of ``VECTOR_PART`` elements
  (``rotate_vector_parts``): one of more than ``MAX_UNIT`` points along the rows. Along the rows of the transpose
  each part would need its own transpose in registers, so that direction keeps the tile load."""
  return spec.hadamard > MAX_UNIT and not output.transposed


def vector_shape(shape: tuple[int, int], d: int) -> tuple[int, int, int, int]:
  """(m, k) as (m, k/d, d/VECTOR_PART, VECTOR_PART): part ``p`` (axis 2) holds elements
  ``[p·VECTOR_PART, (p+1)·VECTOR_PART)`` of every d-chunk along the rows."""
  m, k = shape
  return (m, k // d, d // VECTOR_PART, VECTOR_PART)


def vector_view(x: jax.Array, d: int) -> jax.Array:
  """``x`` reshaped to ``vector_shape`` (free): the input of ``rotate_vector_parts``."""
  return x.reshape(vector_shape(x.shape, d))


def vector_block_spec(tile: tuple[int, int], d: int) -> pl.BlockSpec:
  """The (r, c) tiles of ``x`` as blocks of ``vector_view(x, d)``, on a 2D grid over ``x``'s tiles."""
  return pl.BlockSpec((tile[0], tile[1] // d, d // VECTOR_PART, VECTOR_PART), lambda i, j: (i, j, 0, 0))


def load_vector_parts(ref, tile_index, full_shape) -> list[jax.Array]:
  """The ``d/VECTOR_PART`` parts of the block ``tile_index`` of ``ref``, a ``vector_view`` (``full_shape``: the
  view's), each (r, c/d, VECTOR_PART) in ``ref``'s dtype: part ``p`` is elements ``[p·VECTOR_PART,
  (p+1)·VECTOR_PART)`` of every chunk, one contiguous load per chunk, masked at the array's edges."""
  r, c, n_parts, v = ref.shape
  index, part_shape = (*tile_index, 0, 0), (*full_shape[:2], 1, v)
  return [load_in_bounds(ref.at[:, :, pl.ds(p, 1), :], index, part_shape).reshape(r, c, v) for p in range(n_parts)]


def store_vector_parts(ref, parts: list[jax.Array], tile_index, full_shape) -> None:
  """``load_vector_parts``' inverse: each (r, c/d, VECTOR_PART) part stored where it was read."""
  index, part_shape = (*tile_index, 0, 0), (*full_shape[:2], 1, ref.shape[3])
  for p, part in enumerate(parts):
    value = part.astype(ref.dtype).reshape(*part.shape[:2], 1, part.shape[2])
    store_in_bounds(ref.at[:, :, pl.ds(p, 1), :], value, index, part_shape)


def fwht_vector_parts(parts: list[jax.Array]) -> list[jax.Array]:
  """``fwht`` of chunks held as ``load_vector_parts``' parts, times ``float32(1/sqrt(d))``: the butterflies over the
  chunk index's high bits (part ``p``) first, as ``fwht_parts`` between whole parts, elementwise; those over its low
  bits (within a part) follow, as ``fwht`` of the part's last axis. Both are ``fwht``'s stages in its order (highest
  index bit first, ``(a + b, a - b)`` with ``a`` the element whose bit is 0), so every sum is the same float sum."""
  v = parts[0].shape[-1]
  norm = jnp.float32(1.0 / math.sqrt(len(parts) * v))
  return [hadamard_lib.fwht(part, v) * norm for part in hadamard_lib.fwht_parts(parts)]


def rotate_vector_parts(x_ref, tile_index, full_shape, signs_ref, round_bf16: bool) -> list[jax.Array]:
  """``rotate_rows`` of the (r, c) tile ``tile_index`` of ``x`` (d-point chunks along the rows) as its
  ``d/VECTOR_PART`` parts (``load_vector_parts``), signs first, then ``fwht_vector_parts``: the same bits as
  ``rotate_rows``. The caller stores or reduces the parts as they are (no join: a join into the tile would move data
  between threads)."""
  parts = [part.astype(jnp.float32) for part in load_vector_parts(x_ref, tile_index, full_shape)]
  if signs_ref is not None:
    v = parts[0].shape[-1]
    parts = [part * signs_ref[pl.ds(p * v, v)].reshape(1, 1, v) for p, part in enumerate(parts)]
  parts = fwht_vector_parts(parts)
  return [rtn_bf16(part) for part in parts] if round_bf16 else parts


def chunk_shape(shape: tuple[int, int], d: int, transposed: bool) -> tuple[int, int, int]:
  """(m, k) with element ``i`` of every d-chunk along its own axis: (m/d, d, k) for chunks along the columns
  (``transposed``: rows ``i`` of every d-row chunk), (m, k/d, d) along the rows."""
  m, k = shape
  return (m // d, d, k) if transposed else (m, k // d, d)


def chunk_view(x: jax.Array, d: int, transposed: bool) -> jax.Array:
  """``x`` reshaped to ``chunk_shape`` (free): the input of ``load_rotated``."""
  return x.reshape(chunk_shape(x.shape, d, transposed))


def chunk_block_spec(tile: tuple[int, int], d: int, transposed: bool) -> pl.BlockSpec:
  """The (r, c) tiles of ``x`` as blocks of ``chunk_view(x, d, transposed)``, on a 2D grid over ``x``'s tiles."""
  block = chunk_shape(tile, d, transposed)
  return pl.BlockSpec(block, (lambda i, j: (i, 0, j)) if transposed else (lambda i, j: (i, j, 0)))


def load_rotated(x_ref, tile_index, full_shape, signs_ref, round_bf16: bool, transposed: bool) -> jax.Array:
  """``rotate_rows(tile, d, signs, round_bf16)`` of the (r, c) tile ``tile_index`` of ``x`` — of ``tile.T``, the
  (c, r) tile of ``xᵀ``, for ``transposed`` — read from its block of ``chunk_view(x, d, transposed)``
  (``chunk_block_spec``; ``full_shape``: the view's). Element ``i`` of every chunk is one load, so each butterfly
  (``fwht_parts``) is elementwise between arrays of one layout, in registers, where a tile load spreads a chunk
  over threads that exchange values at every stage; the rotated parts are then joined into whole chunks per
  thread (and the tile transposed once)."""
  axis = 1 if transposed else 2
  d = x_ref.shape[axis]
  view = lambda i: x_ref.at[:, pl.ds(i, 1), :] if transposed else x_ref.at[:, :, pl.ds(i, 1)]
  shape = tuple(n for a, n in enumerate(x_ref.shape) if a != axis)
  block_index = (tile_index[0], 0, tile_index[1]) if transposed else (*tile_index, 0)
  parts = [load_in_bounds(view(i), block_index, full_shape).reshape(shape).astype(jnp.float32) for i in range(d)]
  if signs_ref is not None:
    parts = [part * signs_ref[i] for i, part in enumerate(parts)]
  norm = jnp.float32(1.0 / math.sqrt(d))
  parts = [part * norm for part in hadamard_lib.fwht_parts(parts)]
  if round_bf16:
    parts = [rtn_bf16(part) for part in parts]
  while len(parts) > 1:  # pairs (i, i + d/2) first, so that the joined axes read i in order
    half = len(parts) // 2
    parts = [jnp.stack([a, b], axis=-1) for a, b in zip(parts[:half], parts[half:])]
  chunks = parts[0].reshape(*shape, d)  # (rows, chunks, i), or (chunks, cols, i) transposed
  if not transposed:
    return chunks.reshape(shape[0], shape[1] * d)
  return jnp.transpose(chunks, (1, 0, 2)).reshape(shape[1], shape[0] * d)


def pack_nibbles(codes: jax.Array) -> jax.Array:
  """(R, C) uint8 codes -> (R, C/2) bytes, even element in the low nibble."""
  r, c = codes.shape
  lo, hi = jnp.split(codes.reshape(r, c // 2, 2), 2, axis=-1)
  return (lo.reshape(r, c // 2) | (hi.reshape(r, c // 2) << 4)).astype(jnp.uint8)


def vector_width(dtype) -> int:
  """Elements of ``dtype`` in one 16-byte load, the widest per thread (8 bf16, 4 f32)."""
  return 16 // jnp.dtype(dtype).itemsize


def load_units(x_ref, block_index, full_shape) -> jax.Array:
  """The (r, c) tile of an ``x`` viewed as (rows, n/unit, parts, vec) — unit = parts·vec elements along the
  quantized axis — loaded one part at a time: every load has the same (r, n/unit, vec) layout, so one thread holds
  all ``parts`` vectors of its unit (a block, or a Hadamard chunk) and block maxima, Hadamard butterflies and
  block scales stay in its registers (a single (r, c) load spreads a unit over several threads: shuffles, and each
  block's scale computed by every thread holding part of it). The parts are joined in registers, in element order.
  """
  r, nu, parts, vec = x_ref.shape
  loaded = [
    load_in_bounds(x_ref.at[:, :, pl.ds(p, 1), :], block_index + (0, 0), full_shape).reshape(r, nu, vec)
    for p in range(parts)
  ]
  while len(loaded) > 1:  # (.., w) pairs -> (.., 2w): a register-level join, then the pair's two halves in order
    loaded = [
      jnp.swapaxes(jnp.stack([a, b], axis=-1), -1, -2).reshape(r, nu, 2 * a.shape[-1])
      for a, b in zip(loaded[::2], loaded[1::2])
    ]
  return loaded[0].reshape(r, nu * parts * vec)


# ------------------------------------------------------------------------------------------------ kernel
def hash_index(rows: jax.Array, cols: jax.Array, n_rows: int, n_cols: int, column_major: bool) -> jax.Array:
  """uint32 counter of element (or scale) ``(rows, cols)`` of an ``(n_rows, n_cols)`` array: row-major
  ``rows·n_cols + cols``, or column-major ``cols·n_rows + rows`` (wrapping, as ``fp4jax.bits.index_grid``)."""
  rows, cols = rows.astype(jnp.uint32), cols.astype(jnp.uint32)
  return cols * jnp.uint32(n_rows) + rows if column_major else rows * jnp.uint32(n_cols) + cols


def _kernel(
  *refs,
  spec: QuantizeSpec,
  output: KernelOutput,
  shape,
  logical_out,
  out_shapes,
  has_signs: bool,
  interpret: bool,
  bf16_input: bool,
  transpose_tile: bool,
  rotate: bool,
  in_parts: bool,
):
  """One tile, in the output layout: for ``output.transposed``, ``x``'s tile transposed in registers
  (``transpose_tile``) or the tile of an already transposed ``xᵀ`` (``x_ref`` then holds ``xᵀ``, of ``shape``).
  ``rotate``: apply ``spec``'s Hadamard (False: ``x_ref`` holds the rotated tensor, staged by the pre-pass).
  ``in_parts`` (with both): ``x_ref`` is a block of ``chunk_view(x, d, transposed=True)``, transposed and rotated
  as it is loaded (``load_rotated``).
  A 4D ``shape`` is ``x`` viewed in units (``load_units``); the outputs other than the scales are then viewed as
  (rows, units, elements of a unit) too, so each thread stores what it computed.

  Random bits hash the logical index of each element / scale of the output layout (``logical_out``: the logical
  output shape), row-major, except for ``along="cols"``, whose reference (``fp4jax.quantize(x, axis=0)``) indexes
  ``x`` row-major, i.e. the output column-major.
  """
  it = iter(refs)
  x_ref, amax_ref, eseed_ref, sseed_ref, origin_ref = next(it), next(it), next(it), next(it), next(it)
  signs_ref = next(it) if has_signs else None
  out_refs = {name: next(it) for name, _ in out_shapes}  # codes and scales (if output.packed), deq, mask, gscale
  out_shapes = dict(out_shapes)
  i, j = pl.program_id(0), pl.program_id(1)
  if in_parts:
    x = load_rotated(x_ref, (i, j), shape, signs_ref, bf16_input, transposed=True)
  else:
    x = (load_units if len(shape) == 4 else load_in_bounds)(x_ref, (i, j), shape).astype(jnp.float32)
  out_index, origin = (i, j), (origin_ref[0], origin_ref[1])  # x[0, 0] in the logical tensor
  if output.transposed:
    origin = (origin[1], origin[0])
    if transpose_tile:
      x, out_index = (x if in_parts else x.T), (j, i)
  r, c = x.shape
  row0, col0 = origin[0] + out_index[0] * r, origin[1] + out_index[1] * c  # the tile in the logical output
  column_major = output.along == "cols"
  safe = functools.partial(kernel_safe, interpret=interpret)

  bits = sbits = None
  if spec.rounding == "sr":
    rows, cols = row0 + lax.broadcasted_iota(jnp.int32, (r, c), 0), col0 + lax.broadcasted_iota(jnp.int32, (r, c), 1)
    bits = safe(bits_lib.hash_bits)(eseed_ref[...], hash_index(rows, cols, *logical_out, column_major))
  if spec.rounding == "eden":  # one bit word per scale, indexed in the reference's scale layout
    bs = spec.fmt.block_size
    rows = row0 + lax.broadcasted_iota(jnp.int32, (r, c // bs), 0)
    cols = col0 // bs + lax.broadcasted_iota(jnp.int32, (r, c // bs), 1)
    index = hash_index(rows, cols, logical_out[0], logical_out[1] // bs, column_major)
    sbits = safe(bits_lib.hash_bits)(sseed_ref[...], index)[..., None]
  if rotate and not in_parts:
    x = rotate_rows(x, spec.hadamard, None if signs_ref is None else signs_ref[...], bf16_input)

  block = (spec.fmt.block_size,) if spec.block_shape is None else tuple(spec.block_shape)
  lay = BlockLayout((r, c), 1, block)
  xb = x.reshape(lay.blocked)
  bits = None if bits is None else bits.reshape(lay.blocked)
  # NVFP4's tensor scales from the tensor amax, in every program (two divisions: PTX div.rn.f32 on the GPU), so that
  # no scalar integer arithmetic of the exact divisions runs as XLA glue around the kernel
  blocks = lambda xb, b, sb, amax: quantize_blocks(xb, lay, spec.fmt, spec.rounding, b, sb, amax=amax)
  codes, dec, gscale, exps = safe(blocks)(xb, bits, sbits, amax_ref[0])

  def store(name, value):
    ref, full = out_refs[name], out_shapes[name]
    store_in_bounds(ref, value.reshape(ref.shape), out_index + (0,) * (len(full) - 2), full)

  if output.packed:
    store("scales", spec.fmt.scale_bits(dec, exps))
    store("codes", pack_nibbles(codes.reshape(r, c)))
  if output.dequantize:  # block_scaled_only: value·dec_b is exact in bf16, so the cast does not round
    tensor_scale = gscale if output.dequantize == "with_tensor_scale" else jnp.float32(1.0)
    store("deq", safe(decode_blocks)(codes, dec, tensor_scale).reshape(r, c).astype(out_refs["deq"].dtype))
  if output.trust_mask:
    store("mask", estimators.trust_mask(xb, dec * gscale).reshape(r, c).astype(jnp.uint8))
  if "gscale" in out_refs:  # the tensor decode scale for the GEMM, the same value in every program

    @pl.when((i == 0) & (j == 0))
    def _():
      out_refs["gscale"][...] = jnp.broadcast_to(gscale, out_refs["gscale"].shape)


# ------------------------------------------------------------------------------------------------ wrapper
def _amax_kernel(
  *refs, spec: QuantizeSpec, output: KernelOutput, shape, bf16_input: bool, has_signs: bool, stage: bool
):
  """One partial max|x| per tile (of the tile transposed for ``output.transposed``, then rotated); with ``stage``
  what it reduced is also stored, in ``x``'s dtype (exact: the rotation already rounds to it), as the quantize
  kernel's input: ``xᵀ`` and/or ``x`` rotated."""
  it = iter(refs)
  x_ref = next(it)
  signs_ref = next(it) if has_signs else None
  o_ref = next(it)
  i, j = pl.program_id(0), pl.program_id(1)
  out_index, out_shape = ((j, i), shape[::-1]) if output.transposed else ((i, j), shape)
  if rotates_in_vector_parts(spec, output):  # x_ref and the staged output: blocks of vector_view
    view_shape = vector_shape(shape, spec.hadamard)
    parts = rotate_vector_parts(x_ref, (i, j), view_shape, signs_ref, bf16_input)
    if stage:
      store_vector_parts(next(it), parts, (i, j), view_shape)
    magnitudes = [lax.bitcast_convert_type(part, jnp.int32) & 0x7FFFFFFF for part in parts]
    o_ref[...] = _amax_of_bits(functools.reduce(jnp.maximum, magnitudes)).reshape(1, 1)  # one reduction
    return
  if rotates_in_parts(spec):  # x_ref holds a block of chunk_view(x)
    x = load_rotated(
      x_ref, (i, j), chunk_shape(shape, spec.hadamard, output.transposed), signs_ref, bf16_input, output.transposed
    )
  else:
    tile = load_in_bounds(x_ref, (i, j), shape)
    if stage and not spec.hadamard:  # the transpose only: stored as loaded
      store_in_bounds(next(it), tile.T, out_index, out_shape)
    x = tile.astype(jnp.float32)
    x = x.T if output.transposed else x
    if spec.hadamard:
      x = rotate_rows(x, spec.hadamard, None if signs_ref is None else signs_ref[...], bf16_input)
  if stage and spec.hadamard:
    store_in_bounds(next(it), x.astype(x_ref.dtype), out_index, out_shape)
  o_ref[...] = _amax_of_bits(lax.bitcast_convert_type(x, jnp.int32) & 0x7FFFFFFF).reshape(1, 1)


def _amax_of_bits(magnitudes: jax.Array) -> jax.Array:
  """max|x| from the int32 magnitude bits of float32 ``x``: one integer max, max|x| for finite values, and +Inf
  where any is Inf or NaN (NaN's bits exceed +Inf's; one reduction, where a float max would need a second one to
  see NaN)."""
  amax_bits = jnp.max(magnitudes)
  return jnp.where(amax_bits >= F32_INF_BITS, jnp.float32(jnp.inf), lax.bitcast_convert_type(amax_bits, jnp.float32))


class _Call(NamedTuple):
  """One kernel over a grid of ``x``'s tiles: its body and ``pl.pallas_call``'s inputs and outputs. ``_launch``
  runs one, or several on the same grid as one kernel (each program runs every body on its tile)."""

  body: Callable
  grid: tuple[int, int]
  args: tuple
  in_specs: tuple
  out_shape: tuple
  out_specs: tuple


def _fused_body(*refs, bodies, arity):
  """Every body on this program's tile; ``arity``: (inputs, outputs) per body. The refs come as all inputs, then
  all outputs (``pl.pallas_call``'s order); each body gets its own inputs, then its own outputs."""
  n_in = sum(a for a, _ in arity)
  ins, outs = iter(refs[:n_in]), iter(refs[n_in:])
  for body, (a, b) in zip(bodies, arity):
    body(*[next(ins) for _ in range(a)], *[next(outs) for _ in range(b)])


def _launch(calls: list[_Call], num_warps: int, interpret: bool, name: str) -> list[list[jax.Array]]:
  """``calls`` as one ``pl.pallas_call`` (they must share the grid): each call's outputs."""
  if len({c.grid for c in calls}) != 1:
    raise ValueError(f"fused kernels must run on one grid, got {[c.grid for c in calls]}")
  body = (
    calls[0].body
    if len(calls) == 1
    else functools.partial(
      _fused_body, bodies=tuple(c.body for c in calls), arity=tuple((len(c.args), len(c.out_shape)) for c in calls)
    )
  )
  outs = pl.pallas_call(
    body,
    grid=calls[0].grid,
    in_specs=[s for c in calls for s in c.in_specs],
    out_specs=[s for c in calls for s in c.out_specs],
    out_shape=[s for c in calls for s in c.out_shape],
    compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
    interpret=interpret,
    name=name,
  )(*[a for c in calls for a in c.args])
  outs, got = iter(outs), []
  for c in calls:
    got.append([next(outs) for _ in c.out_shape])
  return got


def _amax_plan(x: jax.Array, spec: QuantizeSpec, output: KernelOutput, signs, stage: bool, tile) -> _Call:
  """The pre-pass kernel over ``x`` in ``tile`` tiles: outputs (partial max per tile, [the staged input])."""
  m, k = x.shape
  grid = (pl.cdiv(m, tile[0]), pl.cdiv(k, tile[1]))
  vectors = rotates_in_vector_parts(spec, output)
  if vectors:
    args, in_specs = [vector_view(x, spec.hadamard)], [vector_block_spec(tile, spec.hadamard)]
  elif rotates_in_parts(spec):
    args = [chunk_view(x, spec.hadamard, output.transposed)]
    in_specs = [chunk_block_spec(tile, spec.hadamard, output.transposed)]
  else:
    args, in_specs = [x], [pl.BlockSpec(tile, lambda i, j: (i, j))]
  if signs is not None:
    args.append(jnp.asarray(signs, jnp.float32))
    in_specs.append(pl.BlockSpec((spec.hadamard,), lambda i, j: (0,)))
  out_shape, out_specs = [jax.ShapeDtypeStruct(grid, jnp.float32)], [pl.BlockSpec((1, 1), lambda i, j: (i, j))]
  if stage:
    if vectors:  # in the vector view, reshaped back by _amax_call
      out_shape.append(jax.ShapeDtypeStruct(args[0].shape, x.dtype))
      out_specs.append(vector_block_spec(tile, spec.hadamard))
    elif output.transposed:
      out_shape.append(jax.ShapeDtypeStruct((k, m), x.dtype))
      out_specs.append(pl.BlockSpec(tile[::-1], lambda i, j: (j, i)))
    else:
      out_shape.append(jax.ShapeDtypeStruct((m, k), x.dtype))
      out_specs.append(pl.BlockSpec(tile, lambda i, j: (i, j)))
  body = functools.partial(
    _amax_kernel,
    spec=spec,
    output=output,
    shape=(m, k),
    bf16_input=x.dtype == jnp.bfloat16,
    has_signs=signs is not None,
    stage=stage,
  )
  return _Call(body, grid, tuple(args), tuple(in_specs), tuple(out_shape), tuple(out_specs))


def _amax_call(
  x: jax.Array, spec: QuantizeSpec, output: KernelOutput, signs, interpret: bool, stage: bool, tile=None, num_warps=None
):
  """The pre-pass kernel over ``x`` in ``tile`` tiles (default ``prepass_tile(spec, output)``) on ``num_warps``
  warps (default ``prepass_num_warps(spec, output)``): (tensor amax, the staged input or None)."""
  (outs,) = _launch(
    [_amax_plan(x, spec, output, signs, stage, tile or prepass_tile(spec, output))],
    prepass_num_warps(spec, output) if num_warps is None else num_warps,
    interpret,
    "fp4_staging_amax" if stage else "fp4_rotated_amax",
  )
  return jnp.max(outs[0]), (outs[1].reshape(x.shape[::-1] if output.transposed else x.shape) if stage else None)


def tensor_amax(
  x: jax.Array,
  spec: QuantizeSpec,
  output: KernelOutput,
  signs,
  *,
  use_kernel: bool = True,
  interpret: bool = False,
):
  """max|x| of the (rotated along ``output.axis``, bf16-rounded) tensor, fp32: the pre-pass, one read of ``x``.

  Any NaN/Inf makes it non-finite (so the tensor scale is NaN, as in ``fp4jax.quantize``), by an explicit
  ``isfinite`` test: XLA's CPU max may drop NaN. No Hadamard: an XLA reduction. With a Hadamard: a Pallas kernel
  that rotates each tile as the quantize kernel does and writes one partial max per tile (XLA's version of the
  rotation is several passes); a tile holding NaN/Inf reports +Inf, so the tensor scale becomes NaN exactly when
  the reference's does.
  """
  if not spec.hadamard or not use_kernel:
    xf = hadamard_lib.rotated(x, spec.hadamard, axis=output.axis, signs=signs) if spec.hadamard else widen(x)
    return jnp.where(jnp.all(jnp.isfinite(xf)), jnp.max(jnp.abs(xf)), jnp.float32(jnp.nan))
  return _amax_call(x, spec, output, signs, interpret, stage=False)[0]


def stage_and_amax(
  x: jax.Array,
  spec: QuantizeSpec,
  output: KernelOutput,
  signs,
  *,
  tile: tuple[int, int] | None = None,
  num_warps: int | None = None,
  interpret: bool = False,
):
  """``(staged, tensor_amax)`` in one pass over ``x``, for a transposed or rotating NVFP4 quantize: the pre-pass
  kernel reads each tile once, transposes (``output.transposed``) and rotates (``spec.hadamard``) it as the quantize
  kernel would, reduces it and writes it: ``staged`` is ``xᵀ`` / ``x``, rotated by ``spec``'s Hadamard with
  ``signs`` and rounded to ``x.dtype`` as ``fp4jax.hadamard.rotated`` does. ``tile`` (of ``x``; default
  ``prepass_tile``) and ``num_warps`` (default ``prepass_num_warps``) change the launch, not the values (the tuning
  sweep: ``benchmarks/kernels_quantize_profile.py --prepass-sweep``)."""
  if not (output.transposed or spec.hadamard):
    raise ValueError(f"stage_and_amax: {spec}, {output} has nothing to stage (neither transposed nor rotated)")
  if tile is not None:
    rotated = tile[0] if output.transposed else tile[1]  # x's axis the Hadamard chunks lie along
    if any(t < 1 or t & (t - 1) for t in tile) or (spec.hadamard and rotated % spec.hadamard):
      raise ValueError(
        f"stage_and_amax: tile {tile} must be two powers of two holding whole {spec.hadamard}-point chunks along "
        f"x's axis {0 if output.transposed else 1} (the rotated one)"
      )
  amax, staged = _amax_call(x, spec, output, signs, interpret, stage=True, tile=tile, num_warps=num_warps)
  return staged, amax


def _check(x, spec: QuantizeSpec, output: KernelOutput, tile):
  if x.ndim != 2:
    raise ValueError(f"x must be 2D (rows, cols) for the fused quantize kernel, got shape {x.shape}")
  if x.dtype not in (jnp.float32, jnp.bfloat16):
    raise TypeError(f"x must be float32 or bfloat16, got {x.dtype}")
  bm, bk = tile
  if any(t & (t - 1) for t in tile):
    raise ValueError(f"tile {tile} must be powers of two (Triton tensor shapes)")
  n_axis = x.shape[0] if output.transposed else x.shape[-1]
  t_axis, t_other = (bm, bk) if output.transposed else (bk, bm)
  unit = output_lib.unit(spec)
  partial_ok = output.transposed and not spec.fmt.scale_mode.startswith("quest")  # zero padding in the tile
  if n_axis % spec.fmt.block_size and not partial_ok:
    raise ValueError(f"the quantized axis length {n_axis} must be a multiple of the block size {spec.fmt.block_size}")
  if spec.hadamard and n_axis % spec.hadamard:
    raise ValueError(f"the quantized axis length {n_axis} must be a multiple of hadamard={spec.hadamard}")
  if t_axis % unit or (spec.block_shape is not None and t_other % 16):
    raise ValueError(f"tile {tile} must hold whole blocks/Hadamard chunks ({unit} along the quantized axis)")


def default_tile(spec: QuantizeSpec, output: KernelOutput) -> tuple[int, int]:
  """(block_rows, block_cols): wide along the quantized axis (coalesced loads), 16·256 elements, or 16·512 for RTN
  along the rows without a Hadamard and with one block scaling (the one case where the wider tile pays); 16x16 tiles
  along the rows take (32, 256), two tile rows."""
  unit = max(output_lib.unit(spec), 16)
  if spec.block_shape is not None and not output.transposed:
    return (32, max(256, unit))
  one_scaling = spec.fmt.block_scale_candidates == 1
  wide = spec.rounding == "rtn" and not spec.hadamard and one_scaling and not output.transposed
  along = max(512 if wide else 256, unit)
  return (along, 32) if output.transposed else (16, along)


def prepass_tile(spec: QuantizeSpec, output: KernelOutput) -> tuple[int, int]:
  """The amax pre-pass's tile of ``x``: (256, 64) where it transposes and rotates in parts (``rotates_in_parts``),
  (16, max(256, d)) where it rotates in vector parts (``rotates_in_vector_parts``: each part then holds a few
  elements per thread, so its butterflies stay in registers), (max(128, d), 32) where it transposes chunks of more
  than ``MAX_UNIT`` points with a tile load (``transposes_wide_chunks``), else ``default_tile(spec, output)``."""
  if rotates_in_parts(spec) and output.transposed:
    return (256, 64)
  if rotates_in_vector_parts(spec, output):
    return (16, max(256, spec.hadamard))
  if transposes_wide_chunks(spec, output):
    return (max(128, spec.hadamard), 32)
  return default_tile(spec, output)


def transposes_wide_chunks(spec: QuantizeSpec, output: KernelOutput) -> bool:
  """Whether the pre-pass transposes a tile and rotates chunks of more than ``MAX_UNIT`` points in it (MS-EDEN's
  128 along the rows of the transpose), as a tile load: the one pre-pass that takes 8 warps
  (``prepass_num_warps``)."""
  return output.transposed and spec.hadamard > MAX_UNIT


def prepass_num_warps(spec: QuantizeSpec, output: KernelOutput) -> int:
  """The amax pre-pass's warps: 8 on ``transposes_wide_chunks``' (128, 32) tiles, else 4 (the pre-pass sweep's
  choices, ``benchmarks/kernels_quantize_profile.py --prepass-sweep``)."""
  return 8 if transposes_wide_chunks(spec, output) else 4


def default_num_warps(spec: QuantizeSpec) -> int:
  """8 for a 128-point Hadamard (MS-EDEN) or more than one block scaling per block (four-over-six), else 4."""
  return 8 if spec.hadamard >= 128 or spec.fmt.block_scale_candidates > 1 else 4


def _check_shard(x, spec: QuantizeSpec, output: KernelOutput, amax, logical_shape):
  if amax is not None and not spec.fmt.has_tensor_scale:
    raise ValueError(f"amax is the NVFP4 tensor amax; {spec.fmt.name} has no tensor scale, pass amax=None")
  if len(logical_shape) != 2 or any(not 0 < n <= big for n, big in zip(x.shape, logical_shape)):
    raise ValueError(f"logical_shape {logical_shape} must be 2D and hold the shard x of shape {x.shape}")
  n_axis = logical_shape[0] if output.transposed else logical_shape[1]
  if spec.rounding == "eden" and n_axis % spec.fmt.block_size:
    raise ValueError(f"logical_shape {logical_shape}: the quantized axis must be a multiple of {spec.fmt.block_size}")


def _each(fn, keys: list) -> list:
  """``[fn(k) for k in keys]``, one call for one key and one call batched under ``jax.vmap`` for more (the same
  values: ``fn`` draws from its key alone)."""
  if len(keys) < 2:
    return [fn(k) for k in keys]
  out = jax.vmap(fn)(jnp.stack(keys))
  return [out[i] for i in range(len(keys))]


def _draws(directions) -> dict:
  """Per direction ``(name, spec, output, key, signs)``, by name: ``(sign vector or None, element-bits seed,
  scale-bits seed)``, the reference's key split (``split_quantize_key``) and draws (``fp4jax.bits.seed_from_key``);
  an explicit ``signs`` replaces the draw of random signs (and then needs no key unless the rounding is random).
  Each stage is batched over the directions (``jax.vmap``, exact: the same keys and bits as one direction at a
  time): one key split and one seed draw for a pair instead of one of each per direction. On a GPU JAX lowers every
  threefry call as its 20 rounds unrolled in the HLO (unless ``jax_threefry_gpu_kernel_lowering``), and a pair in
  every layer's backward pass made four such calls."""
  keyed = [  # (name, key) of the directions that draw
    (name, key)
    for name, spec, _, key, signs in directions
    if needs_quantize_key(key, spec.rounding, spec.hadamard, spec.signs if signs is None else "none")
  ]
  split3 = lambda k: jax.random.split(k, 3)  # noqa: E731
  # name: (signs key, element-bits key, scale-bits key)
  splits = {name: tuple(keys) for (name, _), keys in zip(keyed, _each(split3, [key for _, key in keyed]))}
  wanted = [
    (name, 1 if spec.rounding == "sr" else 2) for name, spec, *_ in directions if spec.rounding in ("sr", "eden")
  ]
  # (name, 1): element-bits seed, (name, 2): scale-bits seed
  seeds = dict(zip(wanted, _each(bits_lib.seed_from_key, [splits[name][j] for name, j in wanted])))
  zero_seed = jnp.zeros((2,), jnp.uint32)
  draws = {}
  for name, spec, _, _, signs in directions:
    if signs is None:
      signs = spec.sign_vector(splits[name][0] if name in splits else None)
    else:
      output_lib.check_signs(spec, signs)
      signs = jnp.asarray(signs, jnp.float32)
    draws[name] = (signs, seeds.get((name, 1), zero_seed), seeds.get((name, 2), zero_seed))
  return draws


ROUTES = ("xla", "prepass", "kernel")


def default_route(spec: QuantizeSpec) -> str:
  """The default route for ``spec``: ``"prepass"`` with a Hadamard (NVFP4's pre-pass rotates every tile anyway, and
  staging its output spares the kernel a second rotation; where there is no pre-pass, ``effective_route`` makes it
  ``"kernel"``, whose rotation hides the in-register transpose); ``"xla"`` without a Hadamard (there the
  in-register transpose costs more than XLA's)."""
  return "prepass" if spec.hadamard else "xla"


def prepass_stages(spec: QuantizeSpec, output: KernelOutput) -> bool:
  """Whether the default route has NVFP4's pre-pass write the kernel's input (where it runs at all)."""
  return effective_route(spec, output, default_route(spec), has_prepass=True) == "prepass"


def effective_route(spec: QuantizeSpec, output: KernelOutput, route: str, has_prepass: bool) -> str:
  """``route``, except ``"prepass"`` where the pre-pass has nothing to stage — no pre-pass (MXFP4, or the amax
  given), or a spec neither transposed nor rotated: then ``"kernel"`` with a Hadamard, ``"xla"`` without."""
  if route not in ROUTES:
    raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
  if route == "prepass" and not (has_prepass and (output.transposed or spec.hadamard)):
    return "kernel" if spec.hadamard else "xla"
  return route


def load_unit(spec: QuantizeSpec, output: KernelOutput, n_axis: int, route: str, tile, num_warps: int) -> int:
  """Elements along the quantized axis that one thread loads and keeps (``load_units``): a block, or a Hadamard
  chunk when larger and rotated in the kernel, up to ``MAX_UNIT`` (the effective ``route`` ``"prepass"`` stages a
  rotated input: a block). 0 (a plain tile load) for 2D blocks, an in-register transpose (``route="kernel"``), an
  axis that is not a whole number of units (zero padding inside the tile), or a tile with fewer units than threads
  (Triton would compute each unit in several threads)."""
  unit = spec.fmt.block_size if route == "prepass" else output_lib.unit(spec)
  if unit > MAX_UNIT or spec.block_shape is not None or (output.transposed and route == "kernel") or n_axis % unit:
    return 0
  return unit if tile[0] * tile[1] // unit >= 32 * num_warps else 0


@functools.partial(
  jax.jit, static_argnames=("spec", "output", "tile", "num_warps", "interpret", "logical_shape", "route")
)
def quantize(
  x: jax.Array,
  spec: QuantizeSpec,
  key: jax.Array | None = None,
  *,
  output: KernelOutput = KernelOutput(),  # noqa: B008 (frozen)
  signs: jax.Array | None = None,
  tile=None,
  num_warps: int | None = None,
  interpret: bool = False,
  amax: jax.Array | None = None,
  origin: jax.Array | None = None,
  logical_shape: tuple[int, int] | None = None,
  route: str | None = None,
  staged: jax.Array | None = None,
) -> Quantized:
  """Quantize 2D ``x`` by the quantizer ``spec`` (an ``fp4jax.QuantizeSpec``; ``output_lib.check`` says which the
  kernel takes) in one kernel pass (plus the amax pre-pass for NVFP4), writing what ``output`` asks for.

  Returns ``Quantized(qtensor, dequantized, trust_mask, global_scale)``: an ``fp4jax.QTensor`` bit-identical to
  ``fp4jax.quantize(x, spec)`` for ``output.along="rows"``; for the transposed directions the QTensor of ``xᵀ``
  (shape (K, M), blocks along its last axis): ``fp4jax.quantize(x, spec, axis=0)`` transposed (``"cols"``) or
  ``fp4jax.quantize(x.T, spec)`` (``"rows_of_transpose"``); None for ``output.packed=False``. ``dequantized`` and
  ``trust_mask`` (or None, as ``output`` asks) are in the same layout; ``global_scale`` is the QTensor's decode
  scale. ``reference.quantize`` computes the same by the pure-JAX quantizer.

  ``signs``: the Hadamard sign vector (shape ``(spec.hadamard,)``, ±1) for ``spec.signs="random"``, instead
  of the draw from ``key`` (e.g. a recipe's fixed signs, or signs shared by both operands of a GEMM).

  ``x`` may be one shard of a larger logical tensor (``quantize_sharded`` runs this per shard under ``shard_map``):
  ``amax`` is then the logical tensor's ``tensor_amax`` (NVFP4 only; +Inf or NaN if any element is non-finite) and
  replaces the pre-pass; ``origin`` (int32 (row, col), may be traced) is where ``x[0, 0]`` sits in the logical tensor
  of static shape ``logical_shape``, so every random bit (SR's per element, MS-EDEN's per scale) hashes the
  element's / scale's logical index. Blocks and Hadamard chunks must not straddle the shard (the caller checks).
  Defaults: the pre-pass, origin (0, 0), logical shape ``x.shape``: the unsharded kernel. ``staged`` (with
  ``amax``): what ``stage_and_amax(x, spec, output, signs)`` wrote for this ``x``, which the kernel then reads (route
  ``"prepass"``): a caller that reduces the amax itself (across shards) keeps the single rotation.

  ``route``: where the transposition (transposed directions) and the Hadamard rotation happen; all routes give the
  same bits (default ``default_route(spec)``):
  * ``"xla"``: XLA transposes ``x``; the pre-pass and the kernel read ``xᵀ`` row-wise; the kernel rotates.
  * ``"prepass"``: NVFP4's pre-pass reads ``x`` and writes the kernel's input as it reduces (``stage_and_amax``):
    ``xᵀ``, rotated with a Hadamard; the kernel then runs only the block numerics, loading whole blocks. Where the
    pre-pass has nothing to stage it is ``"kernel"`` with a Hadamard, ``"xla"`` without (``effective_route``).
  * ``"kernel"``: the quantize kernel transposes each tile in registers and rotates it.
  ``tile`` is always a tile of ``x``; ``tile`` and ``num_warps`` default to ``default_tile`` and
  ``default_num_warps``.
  """
  output_lib.check(spec, output)
  if te_four_over_six_refusal(spec):
    raise backends.Unsupported(f"the quantize kernel: {te_four_over_six_refusal(spec)}")
  num_warps = num_warps or default_num_warps(spec)
  call, finish = _plan(
    x, spec, output, key, signs, tile, num_warps, interpret, amax, origin, logical_shape, route, staged
  )
  (outs,) = _launch([call], num_warps, interpret, f"fp4_quantize_{spec.fmt.name}_{spec.rounding}")
  return finish(outs)


def te_four_over_six_refusal(spec: QuantizeSpec) -> str | None:
  """Why the kernels do not take ``spec``'s format (Transformer Engine's 4over6 arithmetic,
  ``four_over_six_reference="te"``: a left-to-right sum per block that the kernels do not run), or None."""
  if getattr(spec.fmt, "four_over_six_reference", "fp4jax") == "te":
    return "NVFP4 four_over_six_reference='te' (TE's 4over6 arithmetic) runs only in the XLA reference quantizer"
  return None


def pair_refusal(
  rows: QuantizeSpec, cols: QuantizeSpec, rows_output: KernelOutput, cols_output: KernelOutput
) -> str | None:
  """Why ``quantize_pair`` cannot take ``rows`` written as ``rows_output`` and ``cols`` as ``cols_output``, or
  None."""
  if rows_output.transposed or not cols_output.transposed:
    return (
      f"rows must quantize along the rows and cols along axis 0, got along={rows_output.along!r} / "
      f"{cols_output.along!r}"
    )
  for name, spec in (("rows", rows), ("cols", cols)):
    if te_four_over_six_refusal(spec):
      return f"{name}: {te_four_over_six_refusal(spec)}"
    if spec.block_shape is not None:
      return f"{name} has 16x16 tiles (one direction serves both GEMMs: quantize them alone)"
    if spec.hadamard > MAX_UNIT:
      return (
        f"{name} has a {spec.hadamard}-point Hadamard; the pair rotates in the kernel, up to {MAX_UNIT} points "
        "(MS-EDEN's rotation is staged by its own pre-pass: quantize it alone)"
      )
  return None


def pair_pays(rows: QuantizeSpec, cols: QuantizeSpec, rows_output: KernelOutput, cols_output: KernelOutput) -> bool:
  """Whether ``quantize_pair`` beats the two ``quantize`` calls for ``(rows, cols)``: where it takes them and the
  rows have no Hadamard (rows rotated in the same program as the transposed columns make it slower than two
  calls)."""
  return pair_refusal(rows, cols, rows_output, cols_output) is None and not rows.hadamard


def pair_config(cols: QuantizeSpec) -> tuple[tuple[int, int], int]:
  """``quantize_pair``'s default (tile of ``x``, warps): (64, 64) and 8 warps where the columns are rotated, (16,
  256) and 4 without (the tile sweep's choices; larger tiles with 4 warps are much slower)."""
  return ((64, 64), 8) if cols.hadamard else ((16, 256), 4)


@functools.partial(
  jax.jit, static_argnames=("rows", "cols", "rows_output", "cols_output", "tile", "num_warps", "interpret", "shards")
)
def quantize_pair(
  x: jax.Array,
  rows: QuantizeSpec,
  cols: QuantizeSpec,
  rows_key: jax.Array | None = None,
  cols_key: jax.Array | None = None,
  *,
  rows_output: KernelOutput,
  cols_output: KernelOutput,
  rows_signs: jax.Array | None = None,
  cols_signs: jax.Array | None = None,
  tile=None,
  num_warps: int | None = None,
  interpret: bool = False,
  shards: tuple[sharding.OperandShard, ...] = (),
) -> tuple[Quantized, Quantized]:
  """``(quantize(x, rows, rows_key, output=rows_output, signs=rows_signs), quantize(x, cols, cols_key,
  output=cols_output, signs=cols_signs))`` bit for bit, in one pre-pass and one kernel: a tensor quantized along its
  rows and, transposed, along its columns (the activation X of a linear layer for the forward and the
  weight-gradient GEMMs; dY for the data- and the weight-gradient GEMMs).

  Bytes: the two ``quantize`` calls read ``x`` four times (each pre-pass and each kernel; the staged route also
  writes and reads a rotated ``xᵀ``). Here the pre-pass reduces both tensor amaxes from one read (each program
  loads its tile once per direction; the second load hits the cache; without a Hadamard the two amaxes are one
  max|x|, XLA's reduction) and the kernel quantizes both directions of each tile after one read: ``2·sizeof(x)``
  read per element in all. ``rows`` runs along the rows (rotated in the kernel); ``cols`` is transposed in
  registers and, with a Hadamard, rotated as it is loaded (``load_rotated``).
  ``pair_refusal`` names the pairs it does not take (16x16 tiles, a Hadamard over 32 points), ``pair_pays`` those
  it speeds up. ``tile`` (a tile of ``x`` holding whole units of both directions) and ``num_warps`` default to
  ``pair_config(cols)``.

  ``shards`` (one ``fp4jax.sharding.OperandShard`` per split dim of ``x``, naming its mesh axes): ``x`` is one
  device's slice of a logical tensor inside ``shard_map`` (or a named ``jax.vmap``), as for
  ``sharded.quantize_slice``; the pre-pass's amaxes are combined over the shards' axes
  (``fp4jax.sharding.combine_amax``: the logical tensor's amaxes and NaN rule) and both directions hash the logical
  indices of their elements and scales from the slice's origin (``fp4jax.sharding.placement``): the bits of the
  pair of the whole tensor, sliced. Blocks and Hadamard chunks must not straddle shards (the caller checks).
  """
  output_lib.check(rows, rows_output)
  output_lib.check(cols, cols_output)
  refusal = pair_refusal(rows, cols, rows_output, cols_output)
  if refusal:
    raise ValueError(f"quantize_pair: {refusal}")
  pair_tile, pair_warps = pair_config(cols)
  tile, num_warps = tuple(tile or pair_tile), num_warps or pair_warps
  directions = (
    ("rows", rows, rows_output, rows_key, rows_signs),
    ("cols", cols, cols_output, cols_key, cols_signs),
  )
  for _, spec, output, _, _ in directions:
    _check(x, spec, output, tile)
  draws = _draws(directions)
  nvfp4 = [d for d in directions if d[1].fmt.has_tensor_scale]
  amaxes = {}
  if nvfp4 and not any(spec.hadamard for _, spec, *_ in nvfp4):
    # one max|x| serves both: XLA's reduction, which XLA can fold into the fusion that produces x
    amax = tensor_amax(x, nvfp4[0][1], KernelOutput(), None)
    amaxes = {name: amax for name, *_ in nvfp4}
  elif nvfp4:
    plans = []
    for name, spec, output, _, _ in nvfp4:
      amax_output = output if spec.hadamard else KernelOutput()  # a max needs no transpose
      plans.append(_amax_plan(x, spec, amax_output, draws[name][0], False, tile))
    partials = _launch(plans, num_warps, interpret, "fp4_pair_amax")
    amaxes = {name: jnp.max(partial) for (name, *_), (partial,) in zip(nvfp4, partials)}
  origin = logical = None
  if shards:
    amaxes = {name: sharding.combine_amax(amax, sharding.mesh_axes(shards)) for name, amax in amaxes.items()}
    offsets, logical = sharding.placement(shards, x.shape)
    origin = jnp.stack([jnp.asarray(o, jnp.int32) for o in offsets])
  calls, finishes = zip(
    *(
      _plan(
        x,
        spec,
        output,
        key,
        signs,
        tile,
        num_warps,
        interpret,
        amaxes.get(name),
        origin,
        logical,
        "kernel",
        None,
        draws[name],
      )
      for name, spec, output, key, signs in directions
    )
  )
  outs = _launch(list(calls), num_warps, interpret, "fp4_quantize_pair")
  return finishes[0](outs[0]), finishes[1](outs[1])


def _plan(
  x,
  spec: QuantizeSpec,
  output: KernelOutput,
  key,
  signs,
  tile,
  num_warps: int,
  interpret: bool,
  amax,
  origin,
  logical_shape,
  route,
  staged,
  draws: tuple | None = None,
) -> tuple[_Call, Callable]:
  """``quantize``'s kernel for ``spec`` and ``output`` (its NVFP4 pre-pass run unless ``amax`` is given), and the
  function that turns the kernel's outputs into ``Quantized``. ``draws``: ``_draws``' signs and seeds of this
  direction, drawn already (else drawn here from ``key`` and ``signs``)."""
  if staged is not None:
    if amax is None or not (output.transposed or spec.hadamard):
      raise ValueError("staged: the pre-pass's output for a transposed or rotated spec, passed with the amax")
    route = "prepass"
  else:
    route = effective_route(spec, output, route or default_route(spec), spec.fmt.has_tensor_scale and amax is None)
  tile = tuple(tile or default_tile(spec, output))
  _check(x, spec, output, tile)
  logical_shape = tuple(logical_shape or x.shape)
  _check_shard(x, spec, output, amax, logical_shape)
  m, k = x.shape
  bm, bk = tile
  check_quantize_input(x, spec, output.axis)
  block, hadamard = block_dims(spec), spec.hadamard
  signs, eseed, sseed = draws or _draws([(None, spec, output, key, signs)])[None]
  pre_transposed = output.transposed and route != "kernel"
  x_tile = (bk, bm) if pre_transposed else (bm, bk)  # the tile of what the kernel reads
  rotate = bool(spec.hadamard) and route != "prepass"
  kernel_signs = signs if rotate else None  # a staged input is rotated already
  if route == "prepass":
    x_in, amax = (staged, amax) if staged is not None else stage_and_amax(x, spec, output, signs, interpret=interpret)
  else:
    x_in = x.T if pre_transposed else x
  if not spec.fmt.has_tensor_scale:
    amax = jnp.float32(0.0)
  elif amax is None:
    amax = tensor_amax(x_in, spec, KernelOutput() if pre_transposed else output, signs, interpret=interpret)
  amax = jnp.broadcast_to(jnp.asarray(amax, jnp.float32), (2,))  # the kernel computes the tensor scales from it
  origin = jnp.zeros((2,), jnp.int32) if origin is None else jnp.asarray(origin, jnp.int32).reshape(2)

  bs, two_d = spec.fmt.block_size, spec.block_shape is not None
  if pre_transposed:
    out_rows, n_axis, t_rows, t_axis, index = k, m, bk, bm, (lambda i, j: (i, j))
  elif output.transposed:
    out_rows, n_axis, t_rows, t_axis, index = k, m, bk, bm, (lambda i, j: (j, i))
  else:
    out_rows, n_axis, t_rows, t_axis, index = m, k, bm, bk, (lambda i, j: (i, j))
  n_pad = -(-n_axis // bs) * bs
  if two_d:
    s_shape, s_tile = (-(-out_rows // 16), n_pad // 16), (t_rows // 16, t_axis // 16)
  else:
    s_shape, s_tile = (out_rows, n_pad // bs), (t_rows, t_axis // bs)
  unit = load_unit(spec, output, n_axis, route, tile, num_warps)

  def per_row(shape, block, elements_per_item=1):  # viewed as (rows, units, items of a unit) when loading units
    if not unit:
      return shape, block
    n = unit // elements_per_item
    return (shape[0], shape[1] // n, n), (block[0], block[1] // n, n)

  outputs = {}  # name: (shape, block, dtype); the kernel's outputs in this order
  if output.packed:
    outputs["codes"] = (*per_row((out_rows, n_pad // 2), (t_rows, t_axis // 2), 2), jnp.uint8)
    outputs["scales"] = (s_shape, s_tile, jnp.uint8)
  if output.dequantize:
    deq_dtype = x.dtype if output.dequantize == "with_tensor_scale" else jnp.bfloat16
    outputs["deq"] = (*per_row((out_rows, n_axis), (t_rows, t_axis)), deq_dtype)
  if output.trust_mask:
    outputs["mask"] = (*per_row((out_rows, n_axis), (t_rows, t_axis)), jnp.uint8)
  if spec.fmt.has_tensor_scale:
    outputs["gscale"] = ((2,), (2,), jnp.float32)
  out_shape = [jax.ShapeDtypeStruct(shape, dtype) for shape, _, dtype in outputs.values()]
  whole = lambda n: pl.BlockSpec((n,), lambda i, j: (0,))
  tiled = lambda block: pl.BlockSpec(block, lambda i, j: index(i, j) + (0,) * (len(block) - 2))
  out_specs = [whole(2) if name == "gscale" else tiled(block) for name, (_, block, _) in outputs.items()]
  grid = (pl.cdiv(x_in.shape[0], x_tile[0]), pl.cdiv(n_axis if unit else x_in.shape[1], x_tile[1]))
  transpose_tile = output.transposed and route == "kernel"
  in_parts = transpose_tile and rotate and rotates_in_parts(spec)
  if unit:  # (rows, n) -> (rows, units, parts, vec): a free reshape in XLA
    vec = vector_width(x.dtype)
    x_in = x_in.reshape(x_in.shape[0], n_axis // unit, unit // vec, vec)
    x_spec = pl.BlockSpec((x_tile[0], x_tile[1] // unit, unit // vec, vec), lambda i, j: (i, j, 0, 0))
  elif in_parts:
    x_in, x_spec = chunk_view(x_in, spec.hadamard, True), chunk_block_spec(x_tile, spec.hadamard, True)
  else:
    x_spec = pl.BlockSpec(x_tile, lambda i, j: (i, j))
  args = [x_in, amax, eseed, sseed, origin]
  in_specs = [x_spec, whole(2), whole(2), whole(2), whole(2)]
  if kernel_signs is not None:
    args.append(kernel_signs)
    in_specs.append(whole(spec.hadamard))
  logical_out = logical_shape[::-1] if output.transposed else logical_shape
  kernel = functools.partial(
    _kernel,
    spec=spec,
    output=output,
    shape=x_in.shape,
    logical_out=logical_out,
    out_shapes=tuple((name, o[0]) for name, o in outputs.items()),
    has_signs=kernel_signs is not None,
    interpret=interpret,
    bf16_input=x.dtype == jnp.bfloat16,
    transpose_tile=transpose_tile,
    rotate=rotate,
    in_parts=in_parts,
  )
  call = _Call(kernel, grid, tuple(args), tuple(in_specs), tuple(out_shape), tuple(out_specs))
  return call, functools.partial(
    _finish,
    spec=spec,
    output=output,
    names=tuple(outputs),
    signs=signs,
    shape=(out_rows, n_axis),
    block=block,
    hadamard=hadamard,
    dtype=x.dtype,
  )


def _finish(
  outs, *, spec: QuantizeSpec, output: KernelOutput, names, signs, shape, block, hadamard, dtype
) -> Quantized:
  """The kernel's outputs (in ``names`` order) as ``Quantized``."""
  got = dict(zip(names, outs))
  # NVFP4: the kernel's tensor decode scale; MXFP4's is a constant (its format ignores the tensor scales)
  gscale = got.pop("gscale")[0] if "gscale" in got else jnp.float32(spec.fmt.tensor_decode_scale(None))
  got = {name: out.reshape(out.shape[0], -1) for name, out in got.items()}
  qt = None
  if output.packed:
    qt = QTensor(
      codes=got["codes"],
      scales=lax.bitcast_convert_type(got["scales"], spec.fmt.scale_dtype),
      global_scale=gscale,
      signs=signs,
      shape=shape,
      axis=1,
      fmt=spec.fmt,
      block_shape=block,
      hadamard=hadamard,
      dtype=dtype,
    )
  return Quantized(qt, got.get("deq"), got.get("mask"), gscale)
