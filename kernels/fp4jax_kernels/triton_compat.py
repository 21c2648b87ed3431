"""Run fp4jax's pure-JAX numerics inside Pallas Triton kernels, unchanged.

Kernels here call the foundation's functions (``fp4jax.rounding``, ``scaling``, ``eden``, ``bits``) on in-kernel
tiles instead of re-implementing them. A few primitives those functions use have no Pallas Triton lowering or lower
to something inexact, so ``kernel_safe(fn)`` traces ``fn`` to a jaxpr and evaluates it with these substitutions:

* ``div`` (float32): Triton lowers ``arith.divf`` to the approximate ``div.full.f32`` (up to 2 ulp); on the GPU it
  becomes PTX ``div.rn.f32`` (IEEE round-to-nearest-even).
* ``div_rn`` (``fp4jax.ieee``, a named call): the foundation's correctly rounded division, an integer long division
  around a first guess with a fallback to ``div`` for special values. On the GPU the whole call becomes one
  ``div.rn.f32``, the IEEE quotient it emulates: the same bits for every input (its normal-range result is the IEEE
  quotient, its fallback already was this instruction), at a fraction of the instructions.
* ``mul_short_rn``, ``mul_pow2_rn1`` / ``mul_pow2_rn3`` / ``mul_pow2_rn_f32`` (``fp4jax.ieee``, named calls): IEEE
  fp32 products with subnormals, emulated in integers so that XLA:CPU's flushing cannot change them; on the GPU each
  becomes PTX ``mul.rn.f32`` (by exact powers of two; one product where ``2^k`` is a float32), the same products.
* ``mul_unflushed`` (``fp4jax.ieee``, a named call): the IEEE fp32 product with subnormals (emulated in integers on
  the CPU, whose XLA flushes); on the GPU PTX ``mul.rn.f32``, the same product: a subnormal product keeps its sign,
  which an E2M1 zero code keeps (0x8 for a negative one).
* ``round`` (ties to even): no Triton lowering; PTX ``cvt.rni.f32.f32`` (round to nearest integer, ties to even).
* ``sqrt`` (float32): Triton lowers ``math.sqrt`` to the approximate square root; PTX ``sqrt.rn.f32`` is IEEE
  round-to-nearest, as XLA's (QuEST's block standard deviation).
* ``max`` / ``min`` (elementwise and reductions, floating point): Triton lowers them to ``maxnumf`` / ``minnumf``,
  which return the other operand for a NaN; JAX and XLA propagate NaN (``clip(NaN) = NaN``, a block max of a block
  holding NaN is NaN). An explicit NaN test restores that.
* ``reduce_or``: no Triton lowering; ``max`` of the int32 values, exact.
* ``clz``: lowers to ``math.ctlz``, which Triton fails to legalize; a 5-step binary search with shifts, exact.
* ``bitcast_convert_type`` of a constant: the Triton rule expects an IR value; done in numpy instead.
* ``slice`` of a short rank-1 vector (``seed[0]`` in ``fp4jax.bits.hash_bits``): no Triton lowering; a masked sum
  over the vector, exact (one non-zero term).

In interpret mode (CPU) ``div``, ``div_rn``, ``round`` and ``sqrt`` keep their own definitions, so CPU tests compare
the same jaxpr the GPU runs, less the PTX instructions whose IEEE semantics equal them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core

from fp4jax._src.formats import pow2


def _asm(instruction: str, *args: jax.Array) -> jax.Array:
  """One PTX instruction per fp32 element (operands broadcast; scalars and constants as 1-element tensors)."""
  from jax.experimental.pallas import triton as plgpu  # noqa: PLC0415  (GPU-only path)

  shape = jnp.broadcast_shapes(*(jnp.shape(a) for a in args))
  tshape = shape or (1,)
  args = [jnp.broadcast_to(jnp.asarray(a, jnp.float32), tshape) for a in args]
  constraints = ",".join(["=f"] + ["f"] * len(args))
  (out,) = plgpu.elementwise_inline_asm(
    instruction,
    args=args,
    constraints=constraints,
    pack=1,
    result_shape_dtypes=[jax.ShapeDtypeStruct(tshape, jnp.float32)],
  )
  return out.reshape(shape)


def _div(x, y, *, interpret: bool):
  if interpret or x.dtype != jnp.float32:
    return lax.div(x, y)
  return _asm("div.rn.f32 $0, $1, $2;", x, y)


def _round(x, *, rounding_method, interpret: bool):
  if interpret or x.dtype != jnp.float32 or rounding_method != lax.RoundingMethod.TO_NEAREST_EVEN:
    return lax.round(x, rounding_method)
  return _asm("cvt.rni.f32.f32 $0, $1;", x)


def _sqrt(x, *, interpret: bool, **params):
  if interpret or x.dtype != jnp.float32:
    return lax.sqrt_p.bind(x, **params)
  return _asm("sqrt.rn.f32 $0, $1;", x)


def _is_float(x) -> bool:
  return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def _minmax(prim, x, y):
  """Elementwise max/min with XLA's NaN rule (NaN if either operand is NaN); Triton's ``maxnumf`` drops NaN."""
  out = prim.bind(*(jnp.asarray(v) if isinstance(v, (np.ndarray, np.generic)) else v for v in (x, y)))
  if not _is_float(out):
    return out
  return jnp.where(x != x, x, jnp.where(y != y, y, out)).astype(out.dtype)


def _reduce_minmax(prim, x, *, axes, **params):
  """max/min reduction with XLA's NaN rule (NaN if any reduced element is NaN)."""
  out = prim.bind(x, axes=axes, **params)
  if not _is_float(out):
    return out
  has_nan = jnp.max((x != x).astype(jnp.int32), axis=axes) != 0
  return jnp.where(has_nan, jnp.asarray(jnp.nan, out.dtype), out)


def _reduce_or(x, *, axes, **_):
  return jnp.max(x.astype(jnp.int32), axis=axes) != 0


def _clz(x):
  """Leading zeros of a 32-bit integer: halve the window 16, 8, 4, 2, 1 bits (32 for x == 0)."""
  u = lax.bitcast_convert_type(x, jnp.uint32) if x.dtype == jnp.int32 else x.astype(jnp.uint32)
  n = jnp.zeros(u.shape, jnp.int32)
  for s in (16, 8, 4, 2, 1):
    top_clear = (u >> (32 - s)) == 0
    n = n + jnp.where(top_clear, s, 0)
    u = jnp.where(top_clear, u << s, u)
  return (n + (u == 0).astype(jnp.int32)).astype(x.dtype)


def _bitcast(x, *, new_dtype, **params):
  """Constants (literals) are bitcast in numpy: the Triton rule for ``bitcast_convert_type`` needs an IR value."""
  if isinstance(x, (np.ndarray, np.generic)):
    return np.asarray(x).view(np.dtype(new_dtype))
  return lax.bitcast_convert_type_p.bind(x, new_dtype=new_dtype, **params)


def _slice(x, *, start_indices, limit_indices, strides, **_):
  if x.ndim != 1 or (strides and any(s != 1 for s in strides)) or limit_indices[0] - start_indices[0] != 1:
    raise NotImplementedError(f"kernel_safe: only single-element slices of vectors are supported, got {x.shape}")
  hit = lax.broadcasted_iota(jnp.int32, x.shape, 0) == start_indices[0]
  return jnp.sum(jnp.where(hit, x, jnp.zeros_like(x)), keepdims=True).astype(x.dtype)


def _named_rules(interpret: bool) -> dict[str, Callable]:
  """Rules for whole named calls (jitted functions), by name."""
  if interpret:
    return {}
  mul = "mul.rn.f32 $0, $1, $2;"
  return {
    "div_rn": lambda a, b: _asm("div.rn.f32 $0, $1, $2;", a, b),
    "mul_short_rn": lambda a, b: _asm(mul, a, b),
    "mul_unflushed": lambda a, b: _asm(mul, a, b),
    "mul_pow2_rn1": _mul_pow2,
    "mul_pow2_rn_f32": lambda x, k: _asm(mul, x, pow2(k)),
    "mul_pow2_rn3": lambda x, k: _asm(mul, x, _asm(mul, pow2(k), jnp.float32(3.0))),
  }


def _mul_pow2(x, k):
  """IEEE ``x · 2^k``, rounded once, for int32 ``k`` in [-149, 254]: one product where ``k <= 0`` (the factor a
  float32), else two exact ones by ``2^(k >> 1)`` and ``2^(k - (k >> 1))`` (scaling up rounds nothing short of
  overflow)."""
  first = jnp.where(k > 0, k >> 1, k)
  mul = "mul.rn.f32 $0, $1, $2;"
  return _asm(mul, _asm(mul, x, pow2(first)), pow2(k - first))


def _rules(interpret: bool) -> dict[str, Callable]:
  return {
    "div": lambda x, y: _div(x, y, interpret=interpret),
    "round": lambda x, **p: _round(x, rounding_method=p["rounding_method"], interpret=interpret),
    "sqrt": lambda x, **p: _sqrt(x, interpret=interpret, **p),
    "max": functools.partial(_minmax, lax.max_p),
    "min": functools.partial(_minmax, lax.min_p),
    "reduce_max": functools.partial(_reduce_minmax, lax.reduce_max_p),
    "reduce_min": functools.partial(_reduce_minmax, lax.reduce_min_p),
    "reduce_or": _reduce_or,
    "clz": _clz,
    "bitcast_convert_type": _bitcast,
    "slice": _slice,
    # A compiler hint for XLA (fp4jax.ieee.div_rn); inside a kernel it is the identity.
    "optimization_barrier": lambda *xs, **_: list(xs),
  }


def _eval(jaxpr, consts, args, rules, named_rules):
  env = {}

  def read(v):
    # Literals as plain numpy: JAX 0.11 wraps them in a type the Triton lowering does not accept.
    return np.asarray(v.val) if isinstance(v, jex_core.Literal) else env[v]

  for var, val in zip(jaxpr.constvars, consts):
    env[var] = val
  for var, val in zip(jaxpr.invars, args):
    env[var] = val
  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    name = eqn.primitive.name
    inner = eqn.params.get("jaxpr") if name in ("jit", "pjit", "closed_call") else None
    if name == "custom_jvp_call":
      inner = eqn.params["call_jaxpr"]
    if name in rules:
      outs = rules[name](*invals, **eqn.params)
    elif inner is not None and eqn.params.get("name") in named_rules:
      outs = [named_rules[eqn.params["name"]](*invals)]  # a call has a list of results
    elif inner is not None:
      outs = _eval(inner.jaxpr, inner.consts, invals, rules, named_rules)
    else:
      outs = eqn.primitive.bind(*invals, **eqn.params)
    if not eqn.primitive.multiple_results and not isinstance(outs, (list, tuple)):
      outs = [outs]
    for var, val in zip(eqn.outvars, outs):
      env[var] = val
  return [read(v) for v in jaxpr.outvars]


def kernel_safe(fn: Callable, *, interpret: bool) -> Callable:
  """``fn`` evaluated with the substitutions above; same outputs (pytree) as ``fn``."""

  @functools.wraps(fn)
  def wrapped(*args):
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    flat_args = jax.tree_util.tree_leaves(args)
    outs = _eval(closed.jaxpr, closed.consts, flat_args, _rules(interpret), _named_rules(interpret))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)

  return wrapped
