"""Packed export: a trained model's weights as ``fp4jax.QTensor`` (packed E2M1 codes + block scales) and back.

``pack(params, rules)`` quantizes the weights of exactly the layers that the model quantized with ``rules`` runs in
FP4, each as its recipe's forward pass quantizes a weight (its ``fwd_rhs`` spec: format, block shape, Hadamard), so
``unpack(pack(params, rules))`` holds the weights the quantized forward multiplies; other leaves are kept as they
are. ``save`` / ``restore`` write and read the packed tree with orbax (codes and scales as uint8 arrays, the QTensor
metadata as JSON), bit for bit, with a sha256 manifest verified on restore (see ``save``). ``nbytes`` counts stored
bytes (a QTensor: codes + scales + the fp32 tensor scale + the Hadamard signs it carries).

Params are nested dicts (linen ``variables["params"]``; NNX ``nnx.state(model, nnx.Param).to_pure_dict()``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx as flax_nnx
from flax import traverse_util

from fp4jax._src import formats
from fp4jax._src.flax import linen, nnx, ops
from fp4jax._src.flax import rules as rules_lib
from fp4jax._src.formats import FP4Format
from fp4jax._src.quantize import QTensor, packed_nbytes, quantize

ALL_KERNELS = r"(?:.*/)?kernel"  # select= of every kernel leaf
_SIGNS = {"none": "none", "te": "te"}


def weight_quantizer(recipe: Any) -> dict:
  """``fp4jax.quantize`` keyword arguments of the recipe's forward weight operand (``fwd_rhs``).

  Only deterministic block-scaled FP4 weight specs can be exported (every published recipe's forward weight is RTN
  with no or fixed Hadamard signs); FP8, per-channel E2M1 and high-precision weights raise.
  """
  r = ops.resolve(recipe, "pack")
  spec = r.fwd_rhs
  if not isinstance(spec.fmt, FP4Format):
    raise ValueError(
      f"pack: recipe {r.name!r} does not quantize weights to block-scaled FP4 (fwd_rhs.fmt={spec.fmt!r})"
    )
  if spec.is_random or (spec.hadamard and spec.signs not in _SIGNS):
    raise ValueError(f"pack: recipe {r.name!r} quantizes weights with random bits or per-run signs; export needs RTN")
  return dict(
    fmt=spec.fmt,
    rounding="rtn",
    block_shape=spec.block_shape,
    hadamard=spec.hadamard or None,
    hadamard_signs=_SIGNS.get(spec.signs, "none"),
  )


def pack(
  params,
  rules: Any = None,
  *,
  defaults: Sequence[Any] = rules_lib.DEFAULT_HIGH_PRECISION,
  select: str | None = None,
  recipe: Any = None,
  axis: int = 0,
  dtype: Any = None,
):
  """``params`` with the weights of the layers a quantized model runs in FP4 replaced by ``QTensor`` s.

  With ``rules`` (the mode to use after rule-based quantization), exactly the layers the quantized model quantizes
  are packed, each with its own recipe's forward weight quantizer (``weight_quantizer``), so each layer of
  ``unpack(pack(params, rules))`` is the FP4 weight the quantized forward multiplies (for NVFP4, re-quantizing it
  gives back its codes and block scales; an fp32 tensor scale recomputed from its amax may differ in the last bit,
  a bf16 one does not) and the other layers are unchanged. The candidate layers
  are the parents of the ``kernel`` leaves (linen Dense/DenseGeneral/Einsum and NNX Linear/LinearGeneral/Einsum
  store their weight as ``kernel``); ``rules`` resolve against their paths as in ``fp4jax.flax.rules.plan``.
  A packed layer's kernel must be 2-D and contracted along axis 0 (Dense, Linear, ``"...d,df->...f"`` Einsums); an
  Einsum contracting its kernel along another axis is not detected from ``params`` alone: pack it with ``select``.

  With ``select`` instead, every leaf whose "/"-joined path ``re.fullmatch``-es ``select`` (and ndim >= 2) is
  packed with the one ``recipe`` along ``axis``.

  Args:
    params: nested dict (linen ``variables["params"]``; NNX ``nnx.state(model, nnx.Param).to_pure_dict()``).
    rules: what the model was quantized with: the ``rules`` list given to ``fp4jax.flax.quantize`` (with the same
      ``defaults``), the linen ``QuantizedModule`` it returned (its rules and defaults), the quantized NNX model
      (each layer's recipe), or a plan ``{layer path: recipe or None}``.
    defaults: the ``defaults`` given to ``fp4jax.flax.quantize``, when ``rules`` is a list.
    select: regular expression on leaf paths, instead of ``rules`` (``ALL_KERNELS``: every ``kernel`` leaf).
    recipe: the recipe of ``select`` mode (default ``"nvidia_nvfp4"``); not with ``rules``.
    axis: the contraction axis of ``select`` mode's weights (0 for Dense/Linear kernels).
    dtype: the dtype the layers compute in (their ``dtype`` field: a layer casts its kernel to it before
      quantizing, so a bf16 layer's FP4 weight is that of the bf16 kernel); None: each NNX layer's own ``dtype``
      when ``rules`` is the NNX model, else the kernel's dtype. A linen model computing in another dtype than its
      params needs ``dtype``.

  Returns:
    ``params`` with the packed leaves replaced by QTensors (of the kernel's dtype, or ``dtype``).

  Raises:
    TypeError: neither or both of ``rules`` and ``select``; ``recipe`` with ``rules``.
    ValueError: nothing to pack; a planned layer without a 2-D ``kernel``; a recipe whose weights are not RTN
      block-scaled FP4.
  """
  flat = traverse_util.flatten_dict(_to_dict(params))
  if (rules is None) == (select is None) or (rules is not None and recipe is not None):
    raise TypeError(
      "pack: pass the rules the model was quantized with, pack(params, rules) (the list given to "
      "fp4jax.flax.quantize, the QuantizedModule, the quantized NNX model or a {layer path: recipe} plan), so that "
      "exactly the layers the model quantizes are packed, each with its own recipe; or select=<regex on leaf "
      f"paths> with one recipe=... (got rules={rules!r}, select={select!r}, recipe={recipe!r})"
    )
  if select is not None:
    kwargs = weight_quantizer("nvidia_nvfp4" if recipe is None else recipe)
    chosen = {
      k: (kwargs, axis, None) for k, v in flat.items() if re.fullmatch(select, _join_path(k)) and np.ndim(v) >= 2
    }
    if not chosen:
      raise ValueError(
        f"pack: select={select!r} matches no weight of ndim >= 2; leaf paths are {[_join_path(k) for k in flat]}"
      )
  else:
    chosen = _planned_kernels(flat, rules, defaults)
  for k, (kwargs, ax, layer_dtype) in chosen.items():
    w = jnp.asarray(flat[k]).astype(dtype or layer_dtype or jnp.asarray(flat[k]).dtype)
    flat[k] = quantize(w, axis=ax, **kwargs)
  return traverse_util.unflatten_dict(flat)


def _join_path(key: tuple) -> str:
  return "/".join(str(p) for p in key)


def _plan(layer_paths: list[str], rules: Any, defaults: Sequence[Any]) -> dict[str, tuple[Any, Any]]:
  """{layer path: (recipe or None, compute dtype or None)} of ``rules`` in any of the forms ``pack`` takes."""
  if isinstance(rules, linen.QuantizedModule):
    plan = rules_lib.plan(layer_paths, rules.rules, defaults=rules.defaults)
  elif isinstance(rules, flax_nnx.Module):
    return {path: (nnx.layer_recipe(layer), layer.dtype) for path, layer in nnx.layers(rules).items()}
  elif isinstance(rules, Mapping):
    plan = dict(rules)
  else:
    plan = rules_lib.plan(layer_paths, rules, defaults=defaults)
  return {path: (r, None) for path, r in plan.items()}


def _planned_kernels(flat: dict, rules: Any, defaults: Sequence[Any]) -> dict[tuple, tuple[dict, int, Any]]:
  """{kernel key: (quantize kwargs, axis 0, the layer's compute dtype or None)} of the layers ``rules`` quantize."""
  kernels = {_join_path(k[:-1]): k for k in flat if k[-1] == "kernel"}
  chosen = {}
  for path, (r, layer_dtype) in _plan(list(kernels), rules, defaults).items():
    if r is None:
      continue
    if path not in kernels:
      raise ValueError(
        f"pack: the plan names layer {path!r}, which has no kernel in params; layers with a kernel: {list(kernels)}"
      )
    shape = np.shape(flat[kernels[path]])
    if len(shape) != 2:
      raise ValueError(
        f"pack: layer {path!r} has a kernel of shape {shape}; pack(params, rules) packs 2-D (in, out) "
        "kernels contracted along axis 0 (Dense, Linear); pack stacked (nn.scan), DenseGeneral or "
        "Einsum kernels with select=... and axis=..."
      )
    chosen[kernels[path]] = (weight_quantizer(r), 0, layer_dtype)
  if not chosen:
    raise ValueError(f"pack: the rules quantize no layer; layers with a kernel: {list(kernels)}")
  return chosen


def unpack(packed, dtype: Any = None):
  """Every QTensor of a packed tree dequantized; other leaves unchanged (one ``jax.jit``).

  Args:
    packed: a tree of arrays and QTensors (``pack``'s or ``restore``'s output).
    dtype: the dtype of the dequantized arrays; None means each QTensor's original dtype.

  Returns:
    A tree of ``packed``'s structure with each QTensor replaced by its dequantized array (``QTensor.dequantize``:
    inverse Hadamard applied, original shape).
  """
  dequantize = lambda tree: jax.tree.map(
    lambda x: x.dequantize(dtype) if isinstance(x, QTensor) else x, tree, is_leaf=lambda x: isinstance(x, QTensor)
  )
  return jax.jit(dequantize)(packed)


def nbytes(tree) -> int:
  """Bytes stored by a (packed) tree: QTensors count codes, scales, tensor scale and signs.

  Args:
    tree: a tree of arrays (or array-likes) and QTensors.

  Returns:
    The total byte count (an int): for a QTensor its packed codes, block scales, the 4-byte tensor scale and any
    Hadamard signs; for any other leaf its size times its dtype's item size.
  """
  leaves = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, QTensor))
  total = 0
  for x in leaves:
    if isinstance(x, QTensor):
      total += packed_nbytes(x) + (0 if x.signs is None else x.signs.size * x.signs.dtype.itemsize)
    else:
      total += np.size(x) * np.dtype(jnp.asarray(x).dtype).itemsize
  return total


def bytes_report(params, packed) -> dict[str, float]:
  """Storage of a tree before and after ``pack``.

  Args:
    params: the original parameter tree.
    packed: ``pack(params, ...)``'s output.

  Returns:
    A dict: ``"params_bytes"`` (``nbytes(params)``), ``"packed_bytes"`` (``nbytes(packed)``), ``"saved_bytes"``
    (their difference) and ``"ratio"`` (``params_bytes / packed_bytes``).
  """
  before, after = nbytes(params), nbytes(packed)
  return {"params_bytes": before, "packed_bytes": after, "saved_bytes": before - after, "ratio": before / after}


# ------------------------------------------------------------------------------------------------ orbax
def _to_dict(tree):
  return tree.to_pure_dict() if hasattr(tree, "to_pure_dict") else dict(tree)


def _fmt_json(fmt: FP4Format) -> dict:
  return {"name": fmt.name, **{f.name: getattr(fmt, f.name) for f in dataclasses.fields(fmt)}}


def _fmt_from_json(d: dict) -> FP4Format:
  """The format of ``_fmt_json``'s dict; a field it lacks (metadata written before the field existed) keeps the
  named format's default."""
  base = formats.get(d["name"])
  if not isinstance(base, FP4Format):
    raise ValueError(f"format {d['name']!r} in the export metadata is not a block-scaled FP4 format")
  return dataclasses.replace(base, **{f.name: d[f.name] for f in dataclasses.fields(base) if f.name in d})


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
    meta[k] = {
      "kind": "qtensor",
      "shape": list(v.shape),
      "axis": v.axis,
      "fmt": _fmt_json(v.fmt),
      "block_shape": list(v.block_shape),
      "hadamard": v.hadamard,
      "dtype": np.dtype(v.dtype).name,
      "signs": v.signs is not None,
    }
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
      shape=tuple(m["shape"]),
      axis=m["axis"],
      fmt=fmt,
      block_shape=tuple(m["block_shape"]),
      hadamard=m["hadamard"],
      dtype=jnp.dtype(m["dtype"]),
    )
  return traverse_util.unflatten_dict(flat, sep="/")


MANIFEST = "fp4jax_manifest.json"  # beside the orbax directory: sha256 of every file and of every array
_ORBAX = "orbax"


class CorruptCheckpointError(ValueError):
  """A directory given to ``restore`` is not exactly what ``save`` wrote (a file or array fails its sha256)."""


def save(path: str | os.PathLike, packed) -> None:
  """Write a packed tree to the new directory ``path``: orbax data plus a sha256 manifest, atomically.

  Layout: ``path/orbax`` (orbax: arrays via StandardSave, metadata as JSON) and ``path/fp4jax_manifest.json``
  ({"arrays": {leaf path: sha256 of dtype, shape and bytes}, "files": {relative path: [size, sha256]},
  "sha256": of the rest}). Everything is written to a temporary sibling directory that is renamed to ``path``
  only once complete, so an interrupted save leaves no ``path`` for ``restore`` to accept.

  Args:
    path: the directory to create; it must not exist.
    packed: a tree of arrays and QTensors (``pack``'s output).

  Returns:
    None.

  Raises:
    FileExistsError: ``path`` exists.
  """
  import orbax.checkpoint as ocp  # optional dependency (the "experiments" extra): needed only to save / restore

  path = os.path.abspath(os.fspath(path))
  if os.path.lexists(path):
    raise FileExistsError(f"save: {path} exists; save writes a new directory (remove it or choose another path)")
  arrays, meta = _split(packed)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=os.path.dirname(path))
  try:
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
      ckptr.save(
        os.path.join(tmp, _ORBAX),
        args=ocp.args.Composite(arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)),
      )
    _write_manifest(tmp, {"arrays": _array_digests(arrays), "files": _file_digests(tmp)})
    os.rename(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def restore(path: str | os.PathLike, *, verify: bool = True):
  """Read a tree written by ``save``: QTensors rebuilt bit for bit from their codes, scales and metadata.

  Args:
    path: a directory written by ``save``.
    verify: check every file and array against the manifest first (False: load an unverified directory, e.g.
      one saved before manifests existed, whose orbax data is ``path`` itself).

  Returns:
    The saved tree, QTensors included.

  Raises:
    CorruptCheckpointError: a missing, unreadable or altered manifest; a missing, unlisted, truncated or altered
      file; a restored array whose sha256 differs from the saved one (the message names the file or array).
  """
  import orbax.checkpoint as ocp

  path = os.path.abspath(os.fspath(path))
  manifest = _verify_files(path) if verify else None
  data = os.path.join(path, _ORBAX)
  data = data if verify or os.path.isdir(data) else path
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
    meta = ckptr.restore(data, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    arrays = ckptr.restore(data, args=ocp.args.Composite(arrays=ocp.args.StandardRestore()))["arrays"]
  if manifest is not None:
    got = _array_digests(arrays)
    for k, digest in manifest["arrays"].items():
      if got.get(k) != digest:
        raise CorruptCheckpointError(f"restore: array {k!r} of {path} does not match its sha256 in {MANIFEST}")
    if set(got) != set(manifest["arrays"]):
      raise CorruptCheckpointError(
        f"restore: {path} holds arrays {sorted(set(got) ^ set(manifest['arrays']))} "
        f"that {MANIFEST} does not (or the reverse)"
      )
  return _join(arrays, meta)


def _sha256_json(obj) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _array_digests(arrays: dict) -> dict[str, str]:
  """{leaf path: sha256 of its dtype name, shape and C-order bytes}."""
  out = {}
  for k, v in traverse_util.flatten_dict(arrays, sep="/").items():
    a = np.ascontiguousarray(np.asarray(v))
    out[k] = hashlib.sha256(f"{a.dtype.name}{a.shape}".encode() + a.tobytes()).hexdigest()
  return out


def _file_digests(root: str) -> dict[str, list]:
  """{path relative to ``root``: [size, sha256]} of every file under ``root`` except the manifest."""
  out = {}
  for dirpath, _, names in os.walk(root):
    for name in names:
      full = os.path.join(dirpath, name)
      rel = os.path.relpath(full, root).replace(os.sep, "/")
      if rel != MANIFEST:
        with open(full, "rb") as f:
          data = f.read()
        out[rel] = [len(data), hashlib.sha256(data).hexdigest()]
  return out


def _write_manifest(root: str, body: dict) -> None:
  with open(os.path.join(root, MANIFEST), "w") as f:
    json.dump({**body, "sha256": _sha256_json(body)}, f, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())


def _verify_files(path: str) -> dict:
  """The manifest of ``path``, after checking it and every file it lists; raises CorruptCheckpointError."""
  where = os.path.join(path, MANIFEST)
  try:
    with open(where, "rb") as f:
      manifest = json.loads(f.read().decode())
    body = {k: manifest[k] for k in ("arrays", "files")}
    intact = manifest["sha256"] == _sha256_json(body)
  except FileNotFoundError as err:
    raise CorruptCheckpointError(
      f"restore: {path} has no {MANIFEST}: not a complete fp4jax save (interrupted, or "
      "written by another tool); restore(path, verify=False) loads it unverified"
    ) from err
  except (UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
    raise CorruptCheckpointError(f"restore: {where} is unreadable or altered ({err})") from err
  if not intact:
    raise CorruptCheckpointError(f"restore: {where} is altered: its sha256 does not match its content")
  found = _file_digests(path)
  for rel, (size, digest) in body["files"].items():
    if rel not in found:
      raise CorruptCheckpointError(f"restore: file {rel!r} of {path} is missing")
    if found[rel][0] != size:
      raise CorruptCheckpointError(
        f"restore: file {rel!r} of {path} has {found[rel][0]} bytes, {size} saved (truncated or extended)"
      )
    if found[rel][1] != digest:
      raise CorruptCheckpointError(f"restore: file {rel!r} of {path} does not match its sha256 in {MANIFEST}")
  extra = sorted(set(found) - set(body["files"]))
  if extra:
    raise CorruptCheckpointError(f"restore: files {extra} of {path} are not in {MANIFEST}")
  return body
