"""The fused quantize kernel as the ``"pallas"`` implementation of ``fp4jax.operand``'s ops, and its limits.

``quantize_operand`` implements ``fp4jax.operand.QUANTIZE_OP``, ``quantize_operand_pair`` ``PAIR_OP`` and
``quantize_sharded_operand`` ``SHARDED_QUANTIZE_OP`` (one device's slice of a sharded operand, ``fp4jax.sharding``)
(``register`` puts them in ``fp4jax.backends``' registry; ``import fp4jax_kernels`` calls it). Each checks once
whether the kernel takes the case and raises ``fp4jax.backends.Unsupported`` with the reason where it does not,
before tracing anything; ``fp4jax.backends.run`` then falls back to XLA under ``"auto"``.

The operand is folded to 2D (leading dims into rows) and quantized in one kernel pass (plus NVFP4's amax pre-pass):
the Hadamard with the GEMM's signs is applied in the kernel (for NVFP4, by the pre-pass, which writes the rotated
operand for the kernel); the kernel draws the same random bits as the XLA path, writes the bf16 ``values`` directly
(``value(q)·dec_b``: ``dequantize="block_scaled_only"``) and no packed codes (``packed=False``); QuEST (trust-mask)
operands also take the kernel's trust mask. A transposed operand (Wᵀ, dYᵀ, Xᵀ) is written K-major by the kernel
(``along="rows_of_transpose"``: the bits of the transposed layout) by ``pallas_triton.default_route``; batched
tensors are transposed by XLA first.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fp4jax._src import backends, sharding
from fp4jax._src.formats import FP4Format
from fp4jax._src.operand import PAIR_OP, QUANTIZE_OP, SHARDED_QUANTIZE_OP, Operand
from fp4jax._src.recipes import OperandSpec
from fp4jax._src.spec import QuantizeSpec
from fp4jax_kernels.quantize import pallas_triton, sharded
from fp4jax_kernels.quantize.output import KernelOutput

KERNEL_DTYPES = (jnp.float32, jnp.bfloat16)
# "auto" takes the kernel for operands of at least this many elements (2^23): below it a layer's quantizers are
# launch-bound and XLA's fusions were as fast or faster (CHANGELOG.md, 2026-11-26: quantizer backends at three shapes).
AUTO_MIN_ELEMENTS = 1 << 23


def refusal(shape: tuple[int, ...], dtype, spec: OperandSpec, fused_hadamard: bool) -> str | None:
  """Why the fused quantize kernel cannot quantize an operand of ``shape``/``dtype`` (the GEMM's layout: the
  transposed one for a transposed operand) as ``spec`` says, or None.

  ``fused_hadamard``: the kernel would also apply ``spec.hadamard`` (else the operand comes already rotated).
  """
  if spec.clip != "none":
    return f"clip={spec.clip!r} (outlier clamping runs in XLA)"
  if spec.amax != "tensor":
    return f"amax={spec.amax!r} (the kernel takes one tensor scale per operand; per-row tensor scales run in XLA)"
  if not isinstance(spec.fmt, FP4Format):
    return f"fmt={spec.fmt.name} (the kernel writes block-scaled FP4 only)"
  if jnp.dtype(dtype) not in KERNEL_DTYPES:
    return f"input dtype {jnp.dtype(dtype)} (the kernel reads float32 or bfloat16)"
  n, block = shape[-1], spec.fmt.block_size
  if n % block:
    return f"last axis length {n} is not a whole number of {block}-element blocks"
  if fused_hadamard and spec.hadamard and n % spec.hadamard:
    return f"last axis length {n} is not a whole number of {spec.hadamard}-point Hadamard chunks"
  if spec.rounding == "eden" and not fused_hadamard:
    return "MS-EDEN on an already rotated operand (the kernel applies MS-EDEN with its own rotation)"
  if spec.block_shape is not None:
    if len(shape) < 2:
      return f"block_shape={spec.block_shape} on a 1D operand"
    if math.prod(shape[:-2]) > 1 and shape[-2] % 16:
      return f"16x16 tiles of shape {shape} would straddle the folded leading dims (shape[-2] % 16 != 0)"
  return None


def check(shape: tuple[int, ...], dtype, spec: OperandSpec, fused_hadamard: bool, auto: bool) -> None:
  """``Unsupported`` naming ``shape`` and ``spec`` where ``refusal`` says why, or where ``auto`` picks XLA for
  an operand of fewer than ``AUTO_MIN_ELEMENTS`` elements (the callers pass ``auto`` false for an ``any_size``
  operand: ``fp4jax.operand.rotate_and_quantize``)."""
  why = refusal(shape, dtype, spec, fused_hadamard)
  if why is None and auto and math.prod(shape) < AUTO_MIN_ELEMENTS:
    why = f"{math.prod(shape)} elements, fewer than AUTO_MIN_ELEMENTS={AUTO_MIN_ELEMENTS} (XLA is as fast there)"
  if why:
    raise backends.Unsupported(
      f"the fused quantize kernel cannot quantize an operand of shape {shape} as {spec}: {why}"
    )


def varying_axes(x) -> frozenset[str]:
  """The mesh axes over which ``x`` varies inside ``jax.shard_map`` with ``check_vma=True`` (its type's varying
  manual axes: ``manual_axis_type.varying`` in newer JAX, ``vma`` in older), else the empty set (``check_vma=False``,
  ``jax.vmap``, plain ``jit``, or a JAX that types neither)."""
  aval = jax.typeof(x)
  manual = getattr(aval, "manual_axis_type", None)
  return frozenset(manual.varying if manual is not None else getattr(aval, "vma", ()))


def check_invarying(x) -> None:
  """``Unsupported`` where ``x`` varies over mesh axes under ``shard_map(check_vma=True)``: a ``pallas_call``'s
  outputs carry no varying-axes type, which the check rejects; ``"auto"`` then runs XLA."""
  axes = varying_axes(x)
  if axes:
    raise backends.Unsupported(
      f"the operand of shape {x.shape} varies over the mesh axes {sorted(axes)} inside jax.shard_map with "
      "check_vma=True, which a Pallas kernel's outputs cannot type: run the fused kernels inside "
      "jax.shard_map(..., check_vma=False)"
    )


def kernel_args(spec: OperandSpec, hadamard: int, transposed: bool) -> tuple[QuantizeSpec, KernelOutput]:
  """The fused kernel's quantizer for ``spec`` (with the ``hadamard`` it applies; the operand's own signs, fixed or
  drawn, are passed to it as random ones) and its outputs: bf16 values only (and QuEST's trust mask), no packed
  codes."""
  mode = "none" if not hadamard or spec.signs == "none" else ("te" if spec.signs == "te" else "random")
  quantizer = QuantizeSpec(spec.fmt, spec.block_shape, spec.rounding, hadamard, mode)
  output = KernelOutput(
    along="rows_of_transpose" if transposed else "rows",
    dequantize="block_scaled_only",
    trust_mask=spec.estimator == "trust_mask",
    packed=False,
  )
  return quantizer, output


def _as_operand(out, shape) -> tuple[Operand, jax.Array | None]:
  """A kernel's ``Quantized`` (values and mask only: the GEMM reads nothing else) as ``(Operand, mask)``."""
  _, values, mask, global_scale = out
  return Operand(values.reshape(shape), global_scale), None if mask is None else mask.reshape(shape) == 1


def _signs(qspec: QuantizeSpec, signs):
  """The caller's sign vector where the kernel takes one (random signs), else None (TE's or none: its own)."""
  return signs if qspec.signs == "random" else None


def quantize_operand(
  x: jax.Array,
  spec: OperandSpec,
  key,
  signs,
  *,
  fused_hadamard: bool,
  transposed: bool,
  auto: bool,
  any_size: bool = False,
) -> tuple[Operand, jax.Array | None]:
  """``QUANTIZE_OP`` by one pass of the fused kernel on ``x`` folded to 2D: ``fp4jax.operand``'s XLA result of
  ``rotate(xt, spec.hadamard, signs)`` (``xt``: ``swapaxes(x, -1, -2)`` if ``transposed``; no rotation unless
  ``fused_hadamard``), the same bits. Raises ``Unsupported`` (``check``) where the kernel does not take it (under
  ``auto``, unless ``any_size``, an operand below ``AUTO_MIN_ELEMENTS`` too)."""
  out_shape = x.shape[:-2] + (x.shape[-1], x.shape[-2]) if transposed else x.shape
  check(out_shape, x.dtype, spec, fused_hadamard, auto and not any_size)
  check_invarying(x)
  if transposed and math.prod(x.shape[:-2]) > 1:  # the kernel is 2D: a batch of transposes goes through XLA
    x, transposed = jnp.swapaxes(x, -1, -2), False
  qspec, output = kernel_args(spec, spec.hadamard if fused_hadamard else 0, transposed)
  x2 = x.reshape(x.shape[-2:]) if transposed else x.reshape(-1, x.shape[-1])
  out = pallas_triton.quantize(
    x2, qspec, key, output=output, signs=_signs(qspec, signs), interpret=backends.pallas_interpret()
  )
  return _as_operand(out, out_shape)


def _slice_shards(shard, ndim: int, transposed: bool, what: str) -> tuple[sharding.OperandShard, ...]:
  """The split dims of the 2D kernel input (``x`` with its leading dims of size 1 or folded into the rows) from the
  ``fp4jax.sharding.ShardedOperand`` ``shard`` of an operand of rank ``ndim`` (in its transposed layout when
  ``transposed``): () for None. Raises ``Unsupported`` for a split of a dim outside the last two (``what``: the
  operand, for the message)."""
  if shard is None:
    return ()
  out = []
  for s in shard.shards:
    if s.dim < ndim - 2:
      raise backends.Unsupported(
        f"the fused quantize kernel folds the leading dims of {what} into its rows, which a split of dim {s.dim} "
        f"over {s.axis_name!r} does not allow"
      )
    along = s.dim == ndim - 1  # the operand's quantized axis: the kernel input's columns, or rows if transposed
    out.append(sharding.OperandShard(s.axis_name, int(along != transposed), s.label))
  return tuple(sorted(out, key=lambda s: s.dim))


def _pair_shards(shape: tuple[int, ...], shards) -> tuple[sharding.OperandShard, ...]:
  """The split of the 2D kernel input of ``quantize_pair`` from the two directions' shards ``(rows, cols)`` (each a
  ``ShardedOperand`` of its operand's layout, the columns' transposed, or None): () for an unsplit tensor. Raises
  ``Unsupported`` unless both name the same splits of ``x``'s last two dims."""
  rows, cols = (_slice_shards(s, len(shape), t, f"x of shape {shape}") for s, t in zip(shards, (False, True)))
  if [(s.axis_name, s.dim) for s in rows] != [(s.axis_name, s.dim) for s in cols]:
    raise backends.Unsupported(
      f"quantize_pair takes splits of x's last two dims shared by both directions, got rows {shards[0]}, cols "
      f"{shards[1]} for x of shape {shape}"
    )
  return rows


def quantize_operand_pair(x: jax.Array, rows, cols, *, auto: bool, shards=(None, None)):
  """``PAIR_OP`` by ``pallas_triton.quantize_pair``: ``x`` quantized as ``rows = (spec, key, signs)`` and,
  transposed, as ``cols``, in one pre-pass and one kernel. ``shards``: each direction's ``OperandShard`` when ``x``
  is one device's slice of a sharded tensor (the kernel then combines the amaxes over the mesh axes and hashes
  logical indices: the bits of ``SHARDED_QUANTIZE_OP`` on each direction). Raises ``Unsupported`` unless ``x`` is
  2D (leading dims of size 1), a split is one dim of both directions (``_pair_shards``), fusing the two pays
  (``pallas_triton.pair_pays``) and the kernel takes both directions (``check``, evaluated last: where the pair is
  refused earlier, each GEMM's own ``quantize_operand`` checks its operand once)."""
  shape_t = x.shape[:-2] + (x.shape[-1], x.shape[-2])
  if math.prod(x.shape[:-2]) != 1:
    raise backends.Unsupported(f"quantize_pair is 2D: x of shape {x.shape} has leading dims")
  pair_shards = _pair_shards(x.shape, shards)
  if not all(isinstance(spec.fmt, FP4Format) for spec, _, _ in (rows, cols)):
    raise backends.Unsupported(f"quantize_pair writes block-scaled FP4 only, got {rows[0].fmt!r} / {cols[0].fmt!r}")
  qrows, rows_output = kernel_args(rows[0], rows[0].hadamard, False)
  qcols, cols_output = kernel_args(cols[0], cols[0].hadamard, True)
  # first: a pair it does not fuse leaves each direction unchecked
  if not pallas_triton.pair_pays(qrows, qcols, rows_output, cols_output):
    raise backends.Unsupported(f"quantize_pair does not take or speed up rows {rows[0]} and cols {cols[0]}")
  check(x.shape, x.dtype, rows[0], True, auto)
  check(shape_t, x.dtype, cols[0], True, auto)
  check_invarying(x)
  out_r, out_c = pallas_triton.quantize_pair(
    x.reshape(x.shape[-2:]),
    qrows,
    qcols,
    rows[1],
    cols[1],
    rows_output=rows_output,
    cols_output=cols_output,
    rows_signs=_signs(qrows, rows[2]),
    cols_signs=_signs(qcols, cols[2]),
    interpret=backends.pallas_interpret(),
    shards=pair_shards,
  )
  return _as_operand(out_r, x.shape), _as_operand(out_c, shape_t)


def quantize_sharded_operand(
  x: jax.Array,
  spec: OperandSpec,
  key,
  signs,
  shard,
  *,
  fused_hadamard: bool,
  transposed: bool,
  auto: bool,
  any_size: bool = False,
):
  """``SHARDED_QUANTIZE_OP`` by the fused kernel on this device's slice ``x`` of an operand split as ``shard``
  inside ``shard_map`` (with ``check_vma=False``) or ``jax.vmap``: as ``quantize_operand``, the slice transposed
  (``transposed``) and rotated (``fused_hadamard``) in the kernel's pass, with the kernel's amax pre-pass (of the
  rotated slice) on the slice, ``fp4jax.sharding.combine_amax`` over the shard's axes (the logical tensor's amax and
  NaN rule), and the kernel at the slice's logical origin (random bits at logical indices): the bits of
  ``fp4jax.operand``'s XLA path.

  Args:
    x: this device's slice of the operand before the transpose (float32 or bfloat16; after the transpose and the
      rotation, blocks along the last axis).
    spec: the operand's ``OperandSpec``.
    key: the operand's random key (stochastic rounding, MS-EDEN), the same on every shard; None for RTN.
    signs: the GEMM's Hadamard signs (``spec.signs`` random or fixed), the same on every shard; None otherwise.
    shard: the ``fp4jax.sharding.ShardedOperand`` naming the split dims of the operand (in its transposed layout
      when ``transposed``) and their mesh axes.
    fused_hadamard: rotate the slice by ``spec.hadamard`` (else it comes rotated).
    transposed: quantize ``swapaxes(x, -1, -2)`` (a backward GEMM's Xᵀ or dYᵀ).
    auto: called under ``backend="auto"`` (operands below ``AUTO_MIN_ELEMENTS`` are refused: XLA is as fast).
    any_size: under ``auto``, take operands below ``AUTO_MIN_ELEMENTS`` too.

  Returns:
    ``(Operand, mask)``: the slice's quantized operand (bf16 values, the logical tensor's scale) and QuEST's trust
    mask (None for other estimators).

  Raises:
    fp4jax.backends.Unsupported: where ``check`` refuses ``spec`` or the shape; for a split of the rows of an
      operand with leading dims (the kernel folds them into its rows, which the slice's origin cannot describe;
      a batch of transposes is transposed by XLA first); and where ``x`` varies over mesh axes under
      ``shard_map(check_vma=True)`` (``check_invarying``: a ``pallas_call``'s outputs carry no varying-axes type).
      ``"auto"`` then runs XLA; an explicit ``backend="pallas"`` raises it (a ``ValueError``) naming the reason.
  """
  out_shape = x.shape[:-2] + (x.shape[-1], x.shape[-2]) if transposed else x.shape
  check(out_shape, x.dtype, spec, fused_hadamard, auto and not any_size)
  check_invarying(x)
  if transposed and math.prod(x.shape[:-2]) > 1:  # the kernel is 2D: a batch of transposes goes through XLA
    x, transposed = jnp.swapaxes(x, -1, -2), False
  if math.prod(x.shape[:-2]) != 1 and any(s.dim == x.ndim - 2 for s in shard.shards):
    raise backends.Unsupported(
      f"the fused quantize kernel folds the leading dims of an operand of shape {out_shape} into its rows, which a "
      f"split of its rows ({shard}) does not allow"
    )
  # the split dims of the slice the kernel reads (x's layout: a transposed operand's split dims swapped)
  shards = _slice_shards(shard, x.ndim, transposed, f"an operand of shape {out_shape}")
  qspec, output = kernel_args(spec, spec.hadamard if fused_hadamard else 0, transposed)
  x2 = x.reshape(x.shape[-2:]) if transposed else x.reshape(-1, x.shape[-1])
  out = sharded.quantize_slice(
    x2, qspec, key, shards, output=output, interpret=backends.pallas_interpret(), signs=_signs(qspec, signs)
  )
  return _as_operand(out, out_shape)


def register() -> None:
  """Register these as the ``"pallas"`` implementations of ``fp4jax.operand``'s ops."""
  backends.register(QUANTIZE_OP, "pallas", quantize_operand)
  backends.register(PAIR_OP, "pallas", quantize_operand_pair)
  backends.register(SHARDED_QUANTIZE_OP, "pallas", quantize_sharded_operand)
