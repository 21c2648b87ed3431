"""The fused quantize kernel on a sharded 2D tensor: one kernel per shard under ``jax.shard_map``, numerics global.

``quantize_sharded`` gives bit for bit what ``pallas_triton.quantize`` (and ``fp4jax.quantize``) gives on the whole
logical tensor on one device:

The sharding is described as the core describes a sharded operand (``fp4jax.sharding``): one ``OperandShard`` per
split dim of ``x`` (its mesh axes, major to minor), and

* NVFP4 tensor amax: each shard reduces its own (rotated, when ``spec.hadamard``) elements with
  ``pallas_triton.tensor_amax`` — with a Hadamard, ``stage_and_amax``, which also writes the rotated shard for the
  kernel (the default route: one rotation) — then ``fp4jax.sharding.combine_amax`` over the mesh axes that split
  ``x``: the logical tensor's amax, NaN if any shard holds NaN/Inf (the tensor scale is then NaN, as on one device).
* Random bits: the kernel hashes each element's (SR) and each scale's (MS-EDEN) logical row-major index, from the
  shard's origin and the logical shape (``fp4jax.sharding.placement``); signs and seeds come from the same
  replicated key on every shard.
* Blocks and Hadamard chunks never straddle shards (``OperandShard.check`` on the shard's shape in the quantized
  layout): the shard length along the quantized axis must be a multiple of lcm(block, hadamard), and with 16x16
  tiles the other axis a multiple of 16 (else a ValueError names the shape, the mesh axes and the unit).

Output layout: the codes, block scales, the dequantized tensor and the trust mask are sharded like ``x``. With
``spec_in = P(R, C)`` (R, C: a mesh axis name, a tuple of names, or None) and ``output.along="rows"``: codes (M, K/2),
scales (M, K/16) (1D; (M/16, K/16) for 16x16 tiles), dequantized and mask (M, K), all ``P(R, C)``. With the
transposed directions every output is the transposed (K-major) layout of ``pallas_triton.quantize``: codes
(K, M/2), scales (K, M/block), dequantized and mask (K, M), all ``P(C, R)``. The tensor scale and the Hadamard
signs are replicated.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from fp4jax._src import sharding
from fp4jax._src.quantize import (
  QTensor,
  block_dims,
  check_quantize_input,
  split_quantize_key,
)
from fp4jax._src.spec import QuantizeSpec
from fp4jax_kernels.quantize import output as output_lib
from fp4jax_kernels.quantize import pallas_triton
from fp4jax_kernels.quantize.output import KernelOutput, Quantized


def _axis_names(entry) -> tuple[str, ...]:
  """The mesh axes of one PartitionSpec entry (None, a name or a tuple of names), major to minor."""
  if entry is None:
    return ()
  return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _check_layout(
  x, spec: QuantizeSpec, output: KernelOutput, mesh: Mesh, spec_in: P
) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(row axes, column axes) of ``spec_in``; ValueError if ``x`` does not split evenly over them or (the core's
  ``OperandShard.check``) a block, Hadamard chunk or 16x16 tile would straddle two shards."""
  if x.ndim != 2:
    raise ValueError(f"x must be 2D (rows, cols), got shape {x.shape}")
  if not output.packed:
    raise ValueError("quantize_sharded assembles the QTensor of the shards: it needs KernelOutput(packed=True)")
  if len(spec_in) > 2:
    raise ValueError(f"spec_in {spec_in} has more entries than x has dimensions (2)")
  axes = tuple(_axis_names(e) for e in tuple(spec_in) + (None,) * (2 - len(spec_in)))
  local = []
  for dim, names in enumerate(axes):
    for name in names:
      if name not in mesh.shape:
        raise ValueError(f"spec_in {spec_in} names mesh axis {name!r}, not one of the mesh's {tuple(mesh.shape)}")
    parts = math.prod(mesh.shape[name] for name in names)
    if x.shape[dim] % parts:
      raise ValueError(
        f"x of shape {x.shape}: dimension {dim} ({x.shape[dim]}) does not split evenly over mesh "
        f"axes {names} ({parts} shards)"
      )
    local.append(x.shape[dim] // parts)
  order = (1, 0) if output.transposed else (0, 1)  # the quantized layout: the quantized axis last
  shape_q = tuple(local[d] for d in order)
  for dim_q, d in enumerate(order):
    if axes[d]:
      sharding.OperandShard(axes[d], dim_q, f"elements of dim {d}").check(
        shape_q, spec, f"quantize_sharded: x of shape {x.shape} split over mesh axes {axes[d]}"
      )
  return axes[0], axes[1]


def quantize_slice(
  x_slice: jax.Array,
  spec: QuantizeSpec,
  key: jax.Array | None,
  shards: tuple[sharding.OperandShard, ...],
  *,
  output: KernelOutput,
  interpret: bool,
  signs: jax.Array | None = None,
):
  """``pallas_triton.quantize`` of one device's 2D slice of a tensor split as ``shards`` (inside ``shard_map``,
  whose mesh axes they name), with the bits of the whole logical tensor: the slice's tensor amax (of its elements
  rotated as the kernel rotates them; ``stage_and_amax`` where that pays), ``fp4jax.sharding.combine_amax`` over the
  shards' mesh axes, and the kernel at the slice's logical origin (``fp4jax.sharding.placement``).

  Args:
    x_slice: this device's slice, 2D.
    spec: the quantizer.
    key: the replicated key (None for RTN without random signs).
    shards: one ``OperandShard`` per split dim of ``x_slice``, naming its mesh axes.
    output: the kernel's outputs.
    interpret: run the kernels in interpret mode.
    signs: the Hadamard signs given to the kernel (None: the kernel's own, ``spec.sign_vector`` of its key split).

  Returns:
    ``pallas_triton.quantize``'s result for the slice.
  """
  amax = staged = None
  if spec.fmt.has_tensor_scale:  # the pre-pass rotates with the kernel's signs
    if signs is None:
      amax_signs = spec.sign_vector(split_quantize_key(key, spec.rounding, spec.hadamard, spec.signs)[0])
    else:
      amax_signs = signs
    if pallas_triton.prepass_stages(spec, output):
      staged, local = pallas_triton.stage_and_amax(x_slice, spec, output, amax_signs, interpret=interpret)
    else:
      local = pallas_triton.tensor_amax(x_slice, spec, output, amax_signs, interpret=interpret)
    axes = sharding.mesh_axes(shards)
    amax = sharding.combine_amax(local, axes) if axes else local
  origin, logical = sharding.placement(shards, x_slice.shape)
  return pallas_triton.quantize(
    x_slice,
    spec,
    key,
    output=output,
    signs=signs,
    interpret=interpret,
    amax=amax,
    origin=jnp.stack([jnp.asarray(o, jnp.int32) for o in origin]),
    logical_shape=logical,
    staged=staged,
  )


@functools.partial(jax.jit, static_argnames=("spec", "output", "mesh", "spec_in", "interpret"))
def quantize_sharded(
  x: jax.Array,
  spec: QuantizeSpec,
  key: jax.Array | None = None,
  *,
  output: KernelOutput = KernelOutput(),  # noqa: B008 (frozen)
  mesh: Mesh,
  spec_in: P,
  signs: jax.Array | None = None,
  interpret: bool = False,
) -> Quantized:
  """``pallas_triton.quantize(x, spec, key, output=output, signs=signs)`` computed per shard of ``x`` (laid out as
  ``spec_in`` on ``mesh``).

  Returns ``Quantized`` with the logical shapes and bits of the unsharded kernel, the arrays sharded as the module
  docstring says. ``key`` and ``signs`` are replicated (the same on every shard).
  """
  output_lib.check(spec, output)
  row_axes, col_axes = _check_layout(x, spec, output, mesh, spec_in)
  shards = tuple(sharding.OperandShard(names, dim) for dim, names in enumerate((row_axes, col_axes)) if names)
  check_quantize_input(x, spec, output.axis)
  block, hadamard = block_dims(spec), spec.hadamard

  def per_shard(x_shard, key, signs):
    q, deq, mask, _ = quantize_slice(x_shard, spec, key, shards, output=output, interpret=interpret, signs=signs)
    return q.codes, q.scales, q.global_scale, q.signs, deq, mask

  in_spec = P(row_axes or None, col_axes or None)
  out_spec = P(col_axes or None, row_axes or None) if output.transposed else in_spec
  codes, scales, global_scale, signs, deq, mask = jax.shard_map(  # check_vma off: pallas_call outputs carry no vma
    per_shard,
    mesh=mesh,
    in_specs=(in_spec, P(), P()),
    out_specs=(out_spec, out_spec, P(), P(), out_spec, out_spec),
    check_vma=False,
  )(x, key, signs)
  shape = x.shape[::-1] if output.transposed else x.shape
  qt = QTensor(
    codes=codes,
    scales=scales,
    global_scale=global_scale,
    signs=signs,
    shape=shape,
    axis=1,
    fmt=spec.fmt,
    block_shape=block,
    hadamard=hadamard,
    dtype=x.dtype,
  )
  return Quantized(qt, deq, mask, global_scale)
