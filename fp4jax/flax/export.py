"""Packed export: a trained model's weights as ``fp4jax.QTensor`` (packed E2M1 codes + block scales) and back.

``pack(params, recipe=...)`` quantizes the selected weights exactly as the recipe's forward pass quantizes a
weight (its ``fwd_rhs`` spec: format, block shape, Hadamard), so ``unpack(pack(params))`` is the weight the
quantized forward multiplies; other leaves are kept as they are. ``save`` / ``restore`` write and read the packed
tree with orbax (codes and scales as uint8 arrays, the QTensor metadata as JSON), bit for bit. ``nbytes`` counts
stored bytes (a QTensor: codes + scales + the fp32 tensor scale + the Hadamard signs it carries).

Params are nested dicts (linen ``variables["params"]``; NNX ``nnx.state(model, nnx.Param).to_pure_dict()``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from fp4jax.flax import ops
from fp4jax.formats import MXFP4, NVFP4, FP4Format
from fp4jax.quantize import QTensor, packed_nbytes, quantize

DEFAULT_SELECT = r"(?:.*/)?kernel"
_SIGNS = {"none": "none", "te": "te"}


def weight_quantizer(recipe: Any) -> dict:
  """``fp4jax.quantize`` keyword arguments of the recipe's forward weight operand (``fwd_rhs``).

  Only deterministic block-scaled FP4 weight specs can be exported (every published recipe's forward weight is RTN
  with no or fixed Hadamard signs); FP8, per-channel E2M1 and high-precision weights raise.
  """
  r = ops.resolve(recipe, "pack")
  spec = r.fwd_rhs
  if not isinstance(spec.fmt, FP4Format):
    raise ValueError(f"pack: recipe {r.name!r} does not quantize weights to block-scaled FP4 (fwd_rhs.fmt={spec.fmt!r})")
  if spec.is_random or (spec.hadamard and spec.signs not in _SIGNS):
    raise ValueError(f"pack: recipe {r.name!r} quantizes weights with random bits or per-run signs; export needs RTN")
  return dict(fmt=spec.fmt, rounding="rtn", block_shape=spec.block_shape, hadamard=spec.hadamard or None,
              hadamard_signs=_SIGNS.get(spec.signs, "none"))


def pack(params, *, recipe: Any = "nvidia_nvfp4", select: str = DEFAULT_SELECT, axis: int = 0):
  """``params`` with every leaf whose "/"-joined path ``re.fullmatch``-es ``select`` (and ndim >= 2) replaced by a
  ``QTensor`` quantized along ``axis`` (the contraction axis of the layer's dot: 0 for Dense/Linear kernels).

  Raises when ``select`` matches no such leaf.
  """
  kwargs = weight_quantizer(recipe)
  flat = traverse_util.flatten_dict(_to_dict(params), sep="/")
  chosen = [k for k, v in flat.items() if re.fullmatch(select, k) and np.ndim(v) >= 2]
  if not chosen:
    raise ValueError(f"pack: select={select!r} matches no weight of ndim >= 2; leaf paths are {list(flat)}")
  quantize_weight = jax.jit(functools.partial(quantize, axis=axis, **kwargs))
  for k in chosen:
    flat[k] = quantize_weight(flat[k])
  return traverse_util.unflatten_dict(flat, sep="/")


def unpack(packed, dtype: Any = None):
  """Every QTensor dequantized (to ``dtype``, default its original dtype); other leaves unchanged (one jit)."""
  dequantize = lambda tree: jax.tree.map(lambda x: x.dequantize(dtype) if isinstance(x, QTensor) else x, tree,
                                         is_leaf=lambda x: isinstance(x, QTensor))
  return jax.jit(dequantize)(packed)


def nbytes(tree) -> int:
  """Bytes stored by a (packed) tree: QTensors count codes, scales, tensor scale and signs."""
  leaves = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, QTensor))
  total = 0
  for x in leaves:
    if isinstance(x, QTensor):
      total += packed_nbytes(x) + (0 if x.signs is None else x.signs.size * x.signs.dtype.itemsize)
    else:
      total += np.size(x) * np.dtype(jnp.asarray(x).dtype).itemsize
  return total


def bytes_report(params, packed) -> dict[str, float]:
  """{"params_bytes", "packed_bytes", "saved_bytes", "ratio"} of a tree before and after ``pack``."""
  before, after = nbytes(params), nbytes(packed)
  return {"params_bytes": before, "packed_bytes": after, "saved_bytes": before - after, "ratio": before / after}


# ------------------------------------------------------------------------------------------------ orbax
def _to_dict(tree):
  return tree.to_pure_dict() if hasattr(tree, "to_pure_dict") else dict(tree)


def _fmt_json(fmt: FP4Format) -> dict:
  return {"name": fmt.name, "block_size": fmt.block_size, "scale_mode": fmt.scale_mode}


def _fmt_from_json(d: dict) -> FP4Format:
  base = NVFP4 if d["name"] == "nvfp4" else MXFP4
  return dataclasses.replace(base, block_size=d["block_size"], scale_mode=d["scale_mode"])


def _split(packed) -> tuple[dict, dict]:
  """(arrays, metadata): QTensor fields as plain arrays (scales bitcast to uint8) plus JSON metadata."""
  arrays, meta = {}, {}
  for k, v in traverse_util.flatten_dict(_to_dict(packed), sep="/").items():
    if not isinstance(v, QTensor):
      arrays[k], meta[k] = v, {"kind": "array"}
      continue
    arrays[k + "/codes"] = v.codes
    arrays[k + "/scales"] = jax.lax.bitcast_convert_type(v.scales, jnp.uint8)
    arrays[k + "/global_scale"] = v.global_scale
    if v.signs is not None:
      arrays[k + "/signs"] = v.signs
    meta[k] = {"kind": "qtensor", "shape": list(v.shape), "axis": v.axis, "fmt": _fmt_json(v.fmt),
               "block_shape": list(v.block_shape), "hadamard": v.hadamard, "dtype": np.dtype(v.dtype).name,
               "signs": v.signs is not None}
  return traverse_util.unflatten_dict(arrays, sep="/"), meta


def _join(arrays: dict, meta: dict):
  arrays = traverse_util.flatten_dict(arrays, sep="/")
  flat = {}
  for k, m in meta.items():
    if m["kind"] == "array":
      flat[k] = arrays[k]
      continue
    fmt = _fmt_from_json(m["fmt"])
    flat[k] = QTensor(
        codes=jnp.asarray(arrays[k + "/codes"]),
        scales=jax.lax.bitcast_convert_type(jnp.asarray(arrays[k + "/scales"]), fmt.scale_dtype),
        global_scale=jnp.asarray(arrays[k + "/global_scale"]),
        signs=jnp.asarray(arrays[k + "/signs"]) if m["signs"] else None,
        shape=tuple(m["shape"]), axis=m["axis"], fmt=fmt, block_shape=tuple(m["block_shape"]),
        hadamard=m["hadamard"], dtype=jnp.dtype(m["dtype"]),
    )
  return traverse_util.unflatten_dict(flat, sep="/")


def save(path: str | os.PathLike, packed) -> None:
  """Write a packed tree to the (new) directory ``path`` with orbax: arrays via StandardSave, metadata as JSON."""
  import orbax.checkpoint as ocp  # optional dependency (the "experiments" extra): needed only to save / restore

  arrays, meta = _split(packed)
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
    ckptr.save(os.fspath(os.path.abspath(path)),
               args=ocp.args.Composite(arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)))


def restore(path: str | os.PathLike):
  """Read a tree written by ``save``: QTensors rebuilt bit for bit from their codes, scales and metadata."""
  import orbax.checkpoint as ocp

  path = os.fspath(os.path.abspath(path))
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
    meta = ckptr.restore(path, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    arrays = ckptr.restore(path, args=ocp.args.Composite(arrays=ocp.args.StandardRestore()))["arrays"]
  return _join(arrays, meta)
