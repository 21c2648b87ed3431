"""Quantizing one GEMM operand by its ``OperandSpec``, and the GEMM that consumes two of them.

This is the seam between the recipes and the numerics: ``quantize_operand`` (an operand already rotated) and
``rotate_and_quantize`` (the GEMM's Hadamard included) are the single place where an operand's quantizer is chosen.
They run the op ``QUANTIZE_OP`` (``rotate_and_quantize_both``: ``PAIR_OP``) through ``fp4jax.backends``' registry,
by the ``backend`` argument; every implementation gives the same bits for the same key:

* ``"xla"`` (registered here): the pure-JAX path built on ``fp4jax.quantize``'s block numerics (FP4 and the
  block-scaled FP8 formats), ``fp4jax.fp8`` and ``fp4jax.estimators``; it takes every operand.
* ``"pallas"`` (registered by ``fp4jax_kernels.operand``): block-scaled FP4 operands go through the fused quantize
  kernel (Pallas Triton on a GPU, Pallas interpret mode elsewhere) on the operand folded to 2D, in one kernel pass
  per operand (plus NVFP4's amax pre-pass), Hadamard and transpose included; ``PAIR_OP`` quantizes one tensor for
  two GEMMs (along its rows, and transposed) in one pre-pass and one kernel where that pays. The kernels own their
  limits: an operand they cannot take (FP8, MXFP8 and FP8 block scaling, per-channel E2M1, OCC, f16 inputs, a
  last axis that is not whole blocks, per-row tensor scales (``OperandSpec.amax="row"``), ...) raises
  ``fp4jax.backends.Unsupported`` naming the spec.
* ``"auto"`` (the default): the kernels on a GPU that runs them, where they take the operand; ``"xla"`` otherwise
  (on a CPU, ``"xla"`` only: the kernels are neither loaded nor interpreted there).

``inverse_rotate`` (a backward GEMM's gradient out of the rotated domain, trust mask included) is the op
``INVERSE_ROTATE_OP``, by the same backends: XLA's butterflies, and a one-pass Pallas kernel
(``fp4jax_kernels.rotate``) for transforms of up to 32 points.

This module never imports ``fp4jax_kernels``; the registry loads it (``fp4jax.backends.load_plugins``).

An ``Operand`` is a pair ``(values, scale)`` with the dequantized operand equal to ``values · scale``, where ``scale``
is an fp32 scalar (the NVFP4 tensor scale, the MXFP4 headroom factor 4/3 or an FP8 decode scale) or, for per-channel
E2M1 and for NVFP4 / FP8 with ``OperandSpec.amax="row"``, one fp32 decode scale per row (shape
``values.shape[:-1] + (1,)``: per token or output channel, never along the contraction axis), and ``values``
carries everything else. For FP4 and FP8 operands ``values`` are exact in bfloat16 (an E2M1 value times an E4M3
or power-of-two block scale has at most 6 significant bits; FP8 values at most 4), so ``matmul`` multiplies them at
bf16 with fp32 accumulation and applies the scales in the epilogue, as the hardware does with block-scaled FP4 GEMMs
(FP4-REFERENCE §2). Operands that are not exact in bf16 (unquantized f32
inputs, OCC's clamped values plus residual) stay float32 (see ``matmul`` for their GEMM).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fp4jax._src import backends, estimators, fp8
from fp4jax._src import bits as bits_lib
from fp4jax._src import hadamard as hadamard_lib
from fp4jax._src.backends import Backend
from fp4jax._src.formats import (
  E2M1_MAX,
  BlockFP8Format,
  E2M1ChannelFormat,
  FP4Format,
  FP8Format,
  e2m1_decode,
  floor_log2,
  pow2,
)
from fp4jax._src.ieee import div_rn, mul_unflushed, widen
from fp4jax._src.quantize import (
  BlockLayout,
  block_dims,
  check_quantize_input,
  decode_blocks,
  fp8_blocks,
  quantize_blocks,
  split_quantize_key,
)
from fp4jax._src.recipes import OperandSpec
from fp4jax._src.rounding import rtn_bf16, rtn_e2m1

QUANTIZE_OP = "quantize_operand"
PAIR_OP = "quantize_operand_pair"
# one device's slice of a sharded operand inside shard_map (fp4jax.sharding):
# impl(x, spec, key, signs, shard, *, fused_hadamard, transposed, auto, any_size), as QUANTIZE_OP's with the shard
SHARDED_QUANTIZE_OP = "quantize_sharded_operand"
# a backward GEMM's gradient mapped out of the rotated domain: impl(g, d, signs, mask), ``inverse_rotate``'s values
INVERSE_ROTATE_OP = "inverse_rotate"


class Operand(NamedTuple):
  """A quantized GEMM operand: dequantized value ``values · scale`` (``scale`` an fp32 scalar or per-row, keepdims)."""

  values: jax.Array
  scale: jax.Array

  def dequantize(self) -> jax.Array:
    return self.values.astype(jnp.float32) * self.scale

  def swap_last(self) -> Operand:
    """The operand with its last two axes swapped; per-row scales would then lie along the contraction axis, so
    such an operand is dequantized first (float32, exact)."""
    if jnp.ndim(self.scale):
      return Operand(jnp.swapaxes(self.dequantize(), -1, -2), jnp.float32(1.0))
    return Operand(jnp.swapaxes(self.values, -1, -2), self.scale)


def rotate(x: jax.Array, d: int, signs: jax.Array | None) -> jax.Array:
  """Blockwise randomized Hadamard of the last axis (float32; bf16 inputs rounded once to bf16, as TE)."""
  if x.shape[-1] % d:
    raise ValueError(
      f"Hadamard size {d} must divide the contraction length {x.shape[-1]} of this GEMM operand (shape {x.shape}); "
      "pad the dimension or use a recipe variant with a smaller Hadamard size"
    )
  return hadamard_lib.rotated(x, d, signs=signs)


def inverse_rotate(
  g: jax.Array, d: int, signs: jax.Array | None, mask: jax.Array | None = None, *, backend: Backend = "auto"
) -> jax.Array:
  """Transpose of ``rotate`` on the last axis (float32): maps a gradient from the rotated domain back, after zeroing
  it where ``mask`` (a trust mask of ``g``'s shape) is False: ``fp4jax.hadamard.inverse_hadamard(where(mask, g, 0),
  d, axis=-1, signs)``, the same bits from every implementation of ``INVERSE_ROTATE_OP``. ``backend``: the dot's;
  its implementation where it has one that takes the case, else XLA's (as ``rotate_and_quantize_both``: a named
  kernel backend quantizes, the auxiliary rotation falls back)."""
  backend = backends.check(backend, "fp4jax.operand.inverse_rotate")
  order = backends.fallback_order(INVERSE_ROTATE_OP, backend)
  return backends.run(INVERSE_ROTATE_OP, backend, g, d, signs, mask, order=order)


def _xla_inverse_rotate(g: jax.Array, d: int, signs: jax.Array | None, mask: jax.Array | None) -> jax.Array:
  """``INVERSE_ROTATE_OP``'s XLA implementation: takes every case."""
  if mask is not None:
    g = jnp.where(mask, g, jnp.zeros((), g.dtype))
  return hadamard_lib.inverse_hadamard(g, d, axis=-1, signs=signs)


def channel_scale(x: jax.Array, pow2_scale: bool, shard=None) -> jax.Array:
  """Per-row E2M1 encode scale along the last axis: γ = 6 / max|x_row| (1 for a zero row, NaN if not finite);
  ``pow2_scale``: 2^floor(log2 γ) (Microsoft FP4's released code). Keepdims. ``shard``: an
  ``fp4jax.sharding.ShardedOperand``; the max is then over the logical rows."""
  amax = shard.row_amax(x) if shard else jnp.max(jnp.abs(widen(x)), axis=-1, keepdims=True)
  g = div_rn(jnp.float32(E2M1_MAX), jnp.where(amax == 0, jnp.float32(E2M1_MAX), amax))
  if pow2_scale:
    g = pow2(floor_log2(g))
  return jnp.where(jnp.isfinite(amax), g, jnp.float32(jnp.nan))


def row_amax(x: jax.Array, shard=None) -> jax.Array:
  """max|x| of each row along the last axis (fp32, keepdims), NaN for a row holding NaN or Inf: the amax
  ``fp4jax.quantize`` takes of that row alone. ``shard``: an ``fp4jax.sharding.ShardedOperand``; the max is then over
  the logical rows."""
  amax = shard.row_amax(x) if shard else jnp.max(jnp.abs(widen(x)), axis=-1, keepdims=True)
  return jnp.where(jnp.all(jnp.isfinite(x), axis=-1, keepdims=True), amax, jnp.float32(jnp.nan))


def _e2m1_channel(x: jax.Array, pow2_scale: bool, shard=None) -> Operand:
  """E2M1 with per-row absmax scales: ``values = value(rtn_e2m1(x·γ))`` (E2M1 grid values, exact in bf16; ``x·γ``
  the IEEE product with subnormals on every backend, ``mul_unflushed``, so a negative ``x`` gives -0.0 iff
  ``|x·γ| > 2^-150``) and the per-row decode scale ``1/γ`` correctly rounded (``div_rn``), so the dequantized row is
  ``value · fl(1/γ)``."""
  g = channel_scale(x, pow2_scale, shard)
  values = e2m1_decode(rtn_e2m1(mul_unflushed(widen(x), g))).astype(jnp.bfloat16)
  return Operand(values, div_rn(jnp.float32(1.0), g))


def _block_fp4(x: jax.Array, spec: OperandSpec, key, shard=None) -> tuple[Operand, jax.Array | None]:
  """Block-scaled FP4 along the last axis with ``fp4jax.quantize``'s block numerics and random bits (the same codes
  and scales as ``quantize(x, ...)``), kept unpacked: ``values = value(q) · dec_b`` (exact in bf16), ``scale`` the
  tensor decode scale; for ``estimator="trust_mask"`` also ``estimators.trust_mask(x, dec_b · scale)``.
  ``shard``: an ``fp4jax.sharding.ShardedOperand``: the NVFP4 tensor amax is the logical tensor's and the random bits
  hash logical indices."""
  check_quantize_input(x, spec, -1)
  block = block_dims(spec)
  lay = BlockLayout(x.shape, x.ndim - 1, block)
  _, k_elems, k_scales = split_quantize_key(key, spec.rounding, 0, "none")
  where = shard.placement(x.shape) if shard else ()  # (origin, logical shape) of x in the logical tensor
  bits = lay.to_blocks(bits_lib.random_bits(k_elems, x.shape, *where)) if spec.rounding == "sr" else None
  eden = spec.rounding == "eden"
  scale_where = (lay.scale_origin(where[0]), BlockLayout(where[1], lay.axis, block).scale_shape) if shard else ()
  scale_bits = lay.scales_to_blocks(bits_lib.random_bits(k_scales, lay.scale_shape, *scale_where)) if eden else None
  xb = lay.to_blocks(widen(x))
  amax = None
  if spec.amax == "row":
    amax = row_amax(x, shard)[..., None]  # (..., rows, 1, 1): broadcasts over the row's blocks
  elif shard and spec.fmt.has_tensor_scale:
    amax = shard.global_amax(x)
  codes, dec, global_scale, _ = quantize_blocks(xb, lay, spec.fmt, spec.rounding, bits, scale_bits, amax)
  values = lay.from_blocks(decode_blocks(codes, dec, jnp.float32(1.0))).astype(jnp.bfloat16)
  mask = None
  if spec.estimator == "trust_mask":
    mask = lay.from_blocks(estimators.trust_mask(xb, dec * global_scale))
  global_scale = jnp.asarray(global_scale, jnp.float32)
  if spec.amax == "row" and global_scale.ndim:  # NVFP4: one tensor scale per row, keepdims (..., rows, 1)
    global_scale = global_scale[..., 0]
  return Operand(values, global_scale), mask


def _block_fp8(x: jax.Array, spec: OperandSpec) -> Operand:
  """Block-scaled FP8 (``BlockFP8Format``) along the last axis with ``fp4jax.fp8.quantize_blocks``' numerics:
  ``values = f32(v · dec_b)`` in ``fmt.gemm_dtype`` (exact there: bf16 for MXFP8's powers of two, float32 for
  FP8_BLOCK's fp32 scales), scale 1. Nothing is tensor-wide, so a shard quantizes alone (``fp4jax.sharding``
  checks that no block straddles two devices)."""
  check_quantize_input(x, spec, -1)
  lay, v, dec = fp8_blocks(x, spec, x.ndim - 1)
  return Operand(lay.from_blocks(spec.fmt.dequantize_blocks(v, dec)).astype(spec.fmt.gemm_dtype), jnp.float32(1.0))


def rotate_and_quantize_both(
  x: jax.Array,
  rows: tuple[OperandSpec, jax.Array | None, jax.Array | None],
  cols: tuple[OperandSpec, jax.Array | None, jax.Array | None],
  *,
  backend: Backend = "auto",
  shards: tuple = (None, None),
) -> tuple[tuple[Operand, jax.Array | None], tuple[Operand, jax.Array | None]] | None:
  """``(rotate_and_quantize(x, *rows), rotate_and_quantize(x, *cols, transposed=True))``, each ``(spec, key,
  signs)``, by one implementation of ``PAIR_OP`` for both: one tensor quantized for two GEMMs (X for the forward and
  the weight-gradient GEMMs, dY for the data- and the weight-gradient GEMMs) in one pass (the kernels: one pre-pass
  and one kernel read ``x`` twice in all instead of four times), the same bits. None where no implementation
  quantizes both at once (XLA; the kernels where they refuse the pair or it does not pay): each GEMM then quantizes
  its own operand. A named backend other than ``"xla"`` falls back to None too (the single operands keep it), whether
  it refuses the pair or has no implementation of it (``"native"``).

  ``shards``: ``(rows, cols)``, each direction's ``fp4jax.sharding.ShardedOperand`` (the columns' in the transposed
  layout) when ``x`` is one device's slice of a sharded tensor inside ``shard_map``, as ``rotate_and_quantize``'s
  ``shard``: the pair then gives the bits of the sharded single quantizations (the logical tensor's amaxes, random
  bits at logical indices)."""
  backend = backends.check(backend, "fp4jax.operand.rotate_and_quantize_both")
  shape_t = x.shape[:-2] + (x.shape[-1], x.shape[-2])
  for (spec, *_), shard, shape in zip((rows, cols), shards, (x.shape, shape_t)):
    if shard is not None:  # a straddling block or Hadamard chunk is named before any kernel is tried
      shard.check(shape, spec, "fp4jax.operand.rotate_and_quantize_both")
  order = backends.fallback_order(PAIR_OP, backend)
  return backends.run(PAIR_OP, backend, x, rows, cols, auto=backend == "auto", shards=tuple(shards), order=order)


def _unfused_pair(x, rows, cols, *, auto: bool, shards) -> None:
  """``PAIR_OP``'s XLA implementation: none fused (XLA fuses what it can); each GEMM quantizes its operand."""
  del x, rows, cols, auto, shards


def _resolve(backend: Backend, spec: OperandSpec, where: str) -> Backend:
  """``backend`` checked; ``"xla"`` where ``spec`` quantizes nothing (any backend takes it)."""
  backend = backends.check(backend, where)
  return "xla" if spec.fmt is None and spec.clip == "none" else backend


def quantize_operand(
  x: jax.Array, spec: OperandSpec, key: jax.Array | None, *, backend: Backend = "auto", shard=None
) -> tuple[Operand, jax.Array | None]:
  """Quantize ``x`` along its last axis (already rotated if the GEMM has a Hadamard) as ``spec`` says.

  Returns the ``Operand`` and, for ``estimator="trust_mask"``, the bool mask of unclipped elements, else None.
  ``key`` feeds stochastic rounding / MS-EDEN. ``backend``: ``QUANTIZE_OP``'s implementation (module docstring);
  every backend gives the same bits. ``shard``: an ``fp4jax.sharding.ShardedOperand`` when ``x`` is one device's slice
  of a sharded operand inside ``shard_map`` (see ``fp4jax.sharding``; ``SHARDED_QUANTIZE_OP``).
  """
  backend = _resolve(backend, spec, "fp4jax.operand.quantize_operand")
  if shard is not None:
    shard.check(x.shape, spec, "fp4jax.operand.quantize_operand")
  op, sharded = (QUANTIZE_OP, ()) if shard is None else (SHARDED_QUANTIZE_OP, (shard,))
  return backends.run(
    op, backend, x, spec, key, None, *sharded, fused_hadamard=False, transposed=False, auto=backend == "auto"
  )


def rotate_and_quantize(
  x: jax.Array,
  spec: OperandSpec,
  key: jax.Array | None,
  signs: jax.Array | None,
  *,
  backend: Backend = "auto",
  transposed: bool = False,
  shard=None,
  any_size: bool = False,
) -> tuple[Operand, jax.Array | None]:
  """``quantize_operand(rotate(xt, spec.hadamard, signs), spec, key)`` with ``xt = swapaxes(x, -1, -2)`` when
  ``transposed`` (a backward GEMM's Wᵀ, dYᵀ or Xᵀ), else ``x``; no rotation when ``spec.hadamard`` is 0.

  With the Pallas backend one kernel pass does it all: rotation (same butterflies, same bf16 rounding), transpose
  (read ``x``, write the K-major operand; the random bits are ``xt``'s), quantization and the bf16 values; the
  same bits as XLA (QuEST's trust mask too). ``shard``: see ``quantize_operand`` (of the transposed operand when
  ``transposed``); the per-shard kernel also transposes and rotates the slice in its pass. ``any_size``: under
  ``"auto"``, the kernels also take operands below their size threshold (where a layer's quantizers are
  launch-bound), still falling back to XLA where they refuse the case: for a quantization that runs once per step
  over a stack of weights under ``jax.vmap`` (``fp4jax.prequantize_weight``), where XLA's quantizer code would
  make the program larger and its compile longer than the kernel launches cost.
  """
  backend = _resolve(backend, spec, "fp4jax.operand.rotate_and_quantize")
  if shard is not None:  # checked before rotating, so a straddling Hadamard chunk is named as such
    shape = x.shape[:-2] + (x.shape[-1], x.shape[-2]) if transposed else x.shape
    shard.check(shape, spec, "fp4jax.operand.rotate_and_quantize")
  op, sharded = (QUANTIZE_OP, ()) if shard is None else (SHARDED_QUANTIZE_OP, (shard,))
  return backends.run(
    op,
    backend,
    x,
    spec,
    key,
    signs,
    *sharded,
    fused_hadamard=True,
    transposed=transposed,
    auto=backend == "auto",
    any_size=any_size,
  )


def _xla_quantize_operand(
  x: jax.Array,
  spec: OperandSpec,
  key,
  signs,
  shard=None,
  *,
  fused_hadamard: bool,
  transposed: bool,
  auto: bool,
  any_size: bool = False,
) -> tuple[Operand, jax.Array | None]:
  """``QUANTIZE_OP``'s XLA implementation, and with ``shard`` ``SHARDED_QUANTIZE_OP``'s: transpose
  (``transposed``), rotate (``fused_hadamard`` and ``spec.hadamard``), then ``_quantize``, whose OCC bounds take
  the ``"auto"`` select when the quantizer's backend was ``"auto"``; it takes every case (sharded: every case
  ``ShardedOperand.check`` lets through; ``any_size``, a kernel's option, changes nothing here)."""
  del any_size
  if transposed:
    x = jnp.swapaxes(x, -1, -2)
  if fused_hadamard and spec.hadamard:
    x = rotate(x, spec.hadamard, signs)
  return _quantize(x, spec, key, shard, "auto" if auto else "xla")


def _quantize(x, spec: OperandSpec, key, shard=None, select: Backend = "xla") -> tuple[Operand, jax.Array | None]:
  """The operand of ``spec`` from ``x`` (already rotated) by the XLA path; OCC's per-row bounds by the ``select``
  backend (``estimators.occ_bounds``)."""
  residual = None
  if spec.clip == "occ":
    whole = shard.whole_rows(x) if shard else None
    x, residual = estimators.occ_clamp(x, spec.clip_quantile, axis=-1, rows=whole, backend=select)
  mask = None
  if spec.fmt is None:
    op = Operand(x, jnp.float32(1.0))
  elif isinstance(spec.fmt, FP4Format):
    op, mask = _block_fp4(x, spec, key, shard)
  elif isinstance(spec.fmt, BlockFP8Format):
    op = _block_fp8(x, spec)
  elif isinstance(spec.fmt, E2M1ChannelFormat):
    op = _e2m1_channel(x, spec.scale_pow2, shard)
  elif isinstance(spec.fmt, FP8Format):
    amax = row_amax(x, shard) if spec.amax == "row" else shard.global_amax(x) if shard else None
    v, inv = fp8.quantize_fp8(x, spec.fmt, pow2_scale=spec.scale_pow2, amax=amax)
    op = Operand(v.astype(jnp.bfloat16), inv)  # FP8 grid values: exact in bf16
  else:
    raise TypeError(f"fp4jax.operand: no quantizer for the format {spec.fmt!r}")
  if residual is not None:
    op = Operand(op.dequantize() + residual.astype(jnp.float32), jnp.float32(1.0))
  return op, mask


def bf16_parts(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Three bfloat16 arrays ``(hi, mid, lo)`` with ``hi + mid + lo == x`` exactly for float32 ``x`` (normal, finite;
  non-finite ``x`` gives non-finite parts): ``hi = rtn_bf16(x)``, ``mid = rtn_bf16(x − hi)``, ``lo = x − hi − mid``;
  each difference is exact in float32 and ``lo`` has at most 24 − 16 significant bits. Explicit rounding: XLA may
  drop a float32 → bf16 → float32 convert pair."""
  x = x.astype(jnp.float32)
  hi = rtn_bf16(x)
  rest = x - hi
  mid = rtn_bf16(rest)
  return tuple(p.astype(jnp.bfloat16) for p in (hi, mid, rest - mid))


def matmul(a: Operand, b: Operand, precision=None) -> jax.Array:
  """``(a.values · b.valuesᵀ) ⊙ (a.scale · b.scaleᵀ)`` batched over the leading axis, fp32 accumulation and result.

  ``a``: (B, R, C), ``b``: (B, S, C) -> (B, R, S); scalar scales, or per-row ones (``Operand``) whose outer product
  scales the output. bf16 values (exact) multiply at bf16 on accelerators. With ``precision`` None, a float32
  operand facing bf16 values is split there into three bf16 parts (``bf16_parts``, exact), so three bf16 GEMMs
  (products exact, fp32 accumulation, the parts' results added smallest first) replace a float32 GEMM; two float32
  operands multiply at HIGHEST precision (f32 emulation is not silently TF32 on GPUs).

  On the CPU every GEMM runs at float32 with ``precision`` (default HIGHEST). There XLA runs a bf16 x bf16 -> f32
  dot either on AVX512-BF16 pair dot products or, after upcasting it (and dropping the exact f32 -> bf16 convert
  before it), as an f32 dot, and picks per program. The two round their sums differently whenever the sums are not
  exact: FP4 products (at most 12 significant bits) usually sum exactly, FP8 products over E5M2's range often do
  not. So the same fp8 GEMM gave different bits on one device and under a 2-device ``shard_map``. The values are
  exact in either dtype; f32 inputs take that choice away.
  """
  y = product(a.values, b.values, precision, _dot)
  sb = jnp.swapaxes(b.scale, -1, -2) if jnp.ndim(b.scale) else b.scale
  return y * (a.scale * sb)


def product(a: jax.Array, b: jax.Array, precision, dot) -> jax.Array:
  """``dot(a', b', precision')``: the unscaled GEMM of two operands' values as ``matmul`` runs it (its dtypes,
  precision and, off the CPU, the three bf16 parts of a float32 operand facing bf16 values), for any ``dot(a, b,
  precision)`` with fp32 accumulation and result (``matmul``'s batched dot, ``fp4jax.ragged_dot``'s grouped ones)."""
  cpu = jax.default_backend() == "cpu"
  f32, bf16 = jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)
  if not cpu and precision is None and {jnp.dtype(a.dtype), jnp.dtype(b.dtype)} == {f32, bf16}:
    if a.dtype == f32:
      hi, mid, lo = (dot(p, b, None) for p in bf16_parts(a))
    else:
      hi, mid, lo = (dot(a, p, None) for p in bf16_parts(b))
    return lo + mid + hi
  dt = jnp.promote_types(a.dtype, b.dtype)
  if cpu:
    dt = jnp.promote_types(dt, f32)
  if precision is None and dt != bf16:
    precision = jax.lax.Precision.HIGHEST
  return dot(a.astype(dt), b.astype(dt), precision)


def _dot(a: jax.Array, b: jax.Array, precision) -> jax.Array:
  """(B, R, C) x (B, S, C) -> (B, R, S), fp32 accumulation and result."""
  return jax.lax.dot_general(
    a, b, (((2,), (2,)), ((0,), (0,))), precision=precision, preferred_element_type=jnp.float32
  )


backends.register(QUANTIZE_OP, "xla", _xla_quantize_operand)
backends.register(INVERSE_ROTATE_OP, "xla", _xla_inverse_rotate)
backends.register(PAIR_OP, "xla", _unfused_pair)
backends.register(SHARDED_QUANTIZE_OP, "xla", _xla_quantize_operand)
