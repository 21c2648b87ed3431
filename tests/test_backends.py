"""``fp4jax.backends``: one backend vocabulary with ``"auto"`` the default everywhere, the registry's fallback, the
entry point that loads the kernels, and the seam itself (the core never imports the kernels)."""

import argparse
import ast
import dataclasses
import importlib.metadata
import inspect
import tomllib
from pathlib import Path

import flax.linen
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax._src import backends, operand, recipes
from fp4jax._src.backends import Unsupported
from fp4jax._src.flax import linen as qlinen
from fp4jax._src.flax import nnx as qnnx
from fp4jax._src.flax import packed as fq_packed

REPO = Path(__file__).resolve().parents[1]
DN = (((1,), (1,)), ((), ()))
OP = "test_backends.fake"


def _backend_defaults(module) -> dict[str, object]:
  """``{name: default of its backend argument}`` for the public functions and classes of ``module`` that take one
  (linen Modules: their ``backend`` field)."""
  found = {}
  for name, obj in vars(module).items():
    if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
      continue
    if dataclasses.is_dataclass(obj):
      fields = {f.name: f.default for f in dataclasses.fields(obj)}
      if "backend" in fields:
        found[name] = fields["backend"]
    elif callable(obj):
      params = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj).parameters
      if "backend" in params:
        found[name] = params["backend"].default
  return found


def test_every_public_entry_defaults_to_auto():
  from fp4jax_kernels.quantize import api as quantize_api

  from fp4jax_experiments import train

  found = {}
  for module in (fp4jax._src.dot, operand, qlinen, qnnx, quantize_api, fp4jax._src.matmul, fq_packed):
    found.update({f"{module.__name__}.{n}": d for n, d in _backend_defaults(module).items()})
  entries = (
    "dot.dot_general",
    "dot.einsum",
    "flax.linen.Dense",
    "flax.linen.DenseGeneral",
    "flax.linen.Einsum",
    "flax.linen.DotGeneral",
    "flax.linen.quantize",
    "flax.nnx.Linear",
    "flax.nnx.Einsum",
    "flax.nnx.quantize",
    "operand.rotate_and_quantize",
    "matmul.packed_matmul",
    "flax.packed.apply",
    "flax.packed.apply_nnx",
  )
  for name in (f"fp4jax._src.{e}" for e in entries):
    assert name in found, name
  assert {n: d for n, d in found.items() if d != "auto"} == {}
  model = fp4jax.flax.quantize(flax.linen.Dense(4), [fp4jax.flax.Rule(".*", "nvfp4_rtn")])
  assert model.backend == "auto"  # fp4jax.flax.quantize passes its keywords on
  parser = argparse.ArgumentParser()
  train.add_execution_arguments(parser)
  assert parser.parse_args([]).quantizer_backend == "auto"


def test_bad_backend_is_named_by_every_entry():
  x = jnp.ones((16, 64))
  with pytest.raises(ValueError, match=r"fp4jax.dot_general: backend must be one of \('auto', 'xla', 'pallas'"):
    fp4jax.dot_general(x, x, DN, recipe="nvfp4_rtn", backend="triton")
  with pytest.raises(ValueError, match="fp4jax.flax.linen.Dense: backend must be one of"):
    qlinen.Dense(4, recipe="nvfp4_rtn", backend="triton")
  with pytest.raises(ValueError, match="fp4jax.operand.quantize_operand: backend must be one of"):
    operand.quantize_operand(x, recipes.get("nvfp4_rtn").fwd_lhs, None, backend="XLA")


# slow tier; default representative: tests/kernels/test_dot_pallas.py::test_auto_is_xla_off_gpu_and_pallas_where_a_gpu_
# takes_the_operand (nvidia_nvfp4's forward and backward under "auto", and large operands, call no Pallas kernel off a
# GPU: "auto" is XLA's program there, hence its bits)
@pytest.mark.slow
@pytest.mark.parametrize("name", recipes.names())
def test_auto_is_xla_bit_for_bit_on_this_machine(name, jaxpr_equations):
  """Forward output and both gradients, same key: ``"auto"`` gives XLA's bits; off a GPU that runs the kernels it
  is XLA's program (no Pallas kernel, not even interpreted)."""
  m, k, n = 128, 64, 128  # Quartet II's backward RHT-128 needs M and N multiples of 128
  x = jax.random.normal(jax.random.key(1), (m, k), jnp.float32)
  w = jax.random.normal(jax.random.key(2), (n, k), jnp.float32)
  dy = jax.random.normal(jax.random.key(3), (m, n), jnp.float32)

  def fwd_bwd(backend):
    f = lambda x, w, key: fp4jax.dot_general(x, w, DN, recipe=name, key=key, backend=backend)
    return jax.jit(lambda x, w, dy, key: jax.vjp(lambda x, w: f(x, w, key), x, w)[1](dy) + (f(x, w, key),))

  key = jax.random.key(4)
  got, want = fwd_bwd("auto")(x, w, dy, key), fwd_bwd("xla")(x, w, dy, key)
  for g, h in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g).view(np.uint32), np.asarray(h).view(np.uint32))
  if not backends.has_pallas_triton():
    eqns = jaxpr_equations(jax.make_jaxpr(fwd_bwd("auto"))(x, w, dy, key).jaxpr)
    assert not [e for e in eqns if e.primitive.name == "pallas_call"]


@pytest.fixture
def fake_op(monkeypatch):
  """A registered op ``OP`` on a GPU that runs the kernels (``candidates("auto") == ("pallas", "xla")``); its
  implementations record their calls in the yielded list."""
  monkeypatch.setattr(backends, "has_pallas_triton", lambda device=None: True)
  monkeypatch.setattr(backends, "has_native_fp4", lambda device=None: False)
  calls = []
  yield calls
  for name in ("xla", "pallas"):
    backends.unregister(OP, name)


def _impl(name, calls, error=None):
  def impl(x, *, scale):
    calls.append(name)
    if error is not None:
      raise error
    return x * scale

  return impl


def test_a_refusal_falls_back_to_the_next_implementation(fake_op):
  backends.register(OP, "pallas", _impl("pallas", fake_op, Unsupported("tile does not fit")))
  backends.register(OP, "xla", _impl("xla", fake_op))
  assert backends.run(OP, "auto", 3, scale=2) == 6
  assert fake_op == ["pallas", "xla"]
  with pytest.raises(Unsupported, match=r"backend='pallas'.*pallas: tile does not fit"):
    backends.run(OP, "pallas", 3, scale=2)  # named: no fallback
  assert fake_op == ["pallas", "xla", "pallas"]


def test_implementation_returns_what_was_registered_and_none_after_unregister(fake_op):
  impl = _impl("pallas", fake_op)
  backends.register(OP, "pallas", impl)
  assert backends.implementation(OP, "pallas") is impl and backends.implementation(OP, "xla") is None
  backends.unregister(OP, "pallas")
  assert backends.implementation(OP, "pallas") is None


def test_fallback_order_ends_with_xla_and_skips_what_is_not_registered(fake_op, monkeypatch):
  backends.register(OP, "xla", _impl("xla", fake_op))
  assert backends.fallback_order(OP, "pallas") == ("xla",)  # no pallas implementation: XLA alone
  backends.register(OP, "pallas", _impl("pallas", fake_op, Unsupported("tile does not fit")))
  assert backends.fallback_order(OP, "auto") == backends.fallback_order(OP, "pallas") == ("pallas", "xla")
  assert backends.run(OP, "pallas", 3, scale=2, order=backends.fallback_order(OP, "pallas")) == 6
  loads = []
  monkeypatch.setattr(backends, "load_plugins", lambda: loads.append(1))
  assert backends.fallback_order(OP, "xla") == ("xla",) and not loads  # XLA alone loads no kernels
  backends.fallback_order(OP, "native")
  assert loads == [1]


def test_an_error_that_is_not_a_refusal_propagates(fake_op):
  backends.register(OP, "pallas", _impl("pallas", fake_op, ValueError("kernel bug")))
  backends.register(OP, "xla", _impl("xla", fake_op))
  with pytest.raises(ValueError, match="^kernel bug$"):
    backends.run(OP, "auto", 3, scale=2)
  assert fake_op == ["pallas"]  # XLA never ran


def test_every_refusal_is_reported_and_a_missing_named_backend_is_named(fake_op):
  backends.register(OP, "pallas", _impl("pallas", fake_op, Unsupported("dtype f16")))
  backends.register(OP, "xla", _impl("xla", fake_op, Unsupported("no FP4 here")))
  with pytest.raises(Unsupported, match="pallas: dtype f16; xla: no FP4 here"):
    backends.run(OP, "auto", 3, scale=2)
  with pytest.raises(ValueError, match="backend='native': test_backends.fake has no 'native' implementation"):
    backends.run(OP, "native", 3, scale=2)
  with pytest.raises(ValueError, match="cannot register backend 'auto'"):
    backends.register(OP, "auto", _impl("auto", fake_op))


def test_the_entry_point_group_is_loaded_once_when_a_backend_is_missing(fake_op, monkeypatch):
  """``run`` imports the ``"fp4jax.backends"`` entry points (the kernels' registration) on the first call that
  finds a backend with nothing registered, once; ``pyproject.toml`` points that group at ``fp4jax_kernels``."""
  loads = []

  class Entry:
    def load(self):
      loads.append(1)
      backends.register(OP, "pallas", _impl("pallas", fake_op))

  monkeypatch.setattr(backends, "_plugins_loaded", False)
  monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [Entry()] if group == "fp4jax.backends" else [])
  backends.register(OP, "xla", _impl("xla", fake_op))
  assert backends.run(OP, "auto", 3, scale=2) == 6 and fake_op == ["pallas"] and loads == [1]
  backends.unregister(OP, "pallas")
  assert backends.run(OP, "auto", 3, scale=2) == 6 and fake_op == ["pallas", "xla"] and loads == [1]
  with open(REPO / "pyproject.toml", "rb") as f:
    group = tomllib.load(f)["project"]["entry-points"]["fp4jax.backends"]
  assert group == {"pallas": "fp4jax_kernels"}


def _imported_modules(path: Path) -> set[str]:
  """Every module an ``import`` or ``from ... import`` in ``path`` names (``from a.b import c``: ``a.b`` and
  ``a.b.c``; ``from a import b``: ``a.b``), at any depth (inside functions too)."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      names |= {node.module} if "." in node.module else set()  # "from fp4jax import x" names fp4jax.x only
      names |= {f"{node.module}.{alias.name}" for alias in node.names}
  return names


def test_the_core_never_imports_the_kernels_and_the_kernels_only_the_numerics():
  core = {p: _imported_modules(p) for p in (REPO / "fp4jax").rglob("*.py")}
  assert {
    str(p): sorted(m for m in names if m.startswith("fp4jax_kernels"))
    for p, names in core.items()
    if any(m.startswith("fp4jax_kernels") for m in names)
  } == {}
  above = ("fp4jax", "fp4jax._src.dot", "fp4jax.dot_general", "fp4jax.einsum", "fp4jax.flax", "fp4jax._src.flax")
  # the library's kernel modules; the developer tools (bench.py, profile.py) time whole layers through dot_general
  kernels = {
    p: _imported_modules(p)
    for p in (REPO / "kernels" / "fp4jax_kernels").rglob("*.py")
    if p.name not in ("bench.py", "profile.py")
  }
  assert len(kernels) > 10
  bad = {
    str(p): sorted(m for m in names if m in above or m.startswith(("fp4jax.flax.", "fp4jax._src.flax.")))
    for p, names in kernels.items()
  }
  assert {p: m for p, m in bad.items() if m} == {}


def test_explicit_pallas_refuses_a_backward_operand_when_the_forward_is_traced():
  """nvfp4_rtn's weight-gradient GEMM quantizes Xᵀ along the tokens: 24 tokens are not whole 16-element blocks for
  the kernel. With ``backend="pallas"`` that fails already when the forward alone is traced, naming the backward and
  the layer's shapes; 32 tokens run forward and backward, and ``"auto"`` takes 24 (XLA where the kernel refuses)."""
  dn = (((1,), (1,)), ((), ()))
  w = jnp.ones((128, 256), jnp.bfloat16)
  forward = lambda x, backend: fp4jax.dot_general(x, w, dn, recipe="nvfp4_rtn", backend=backend)
  backward = r"cannot run this layer's backward \(x as \(batch, tokens, features\) = \(1, 24"
  with pytest.raises(Unsupported, match=backward):
    jax.eval_shape(lambda x: forward(x, "pallas"), jax.ShapeDtypeStruct((24, 256), jnp.bfloat16))
  loss = lambda x, backend: forward(x, backend).astype(jnp.float32).sum()
  assert jax.eval_shape(jax.grad(lambda x: loss(x, "pallas")), jnp.ones((32, 256), jnp.bfloat16)).shape == (32, 256)
  assert jax.eval_shape(jax.grad(lambda x: loss(x, "auto")), jnp.ones((24, 256), jnp.bfloat16)).shape == (24, 256)
