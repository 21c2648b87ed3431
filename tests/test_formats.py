"""Formats are objects (issue 29, item 4): behaviour lives in ``fp4jax.formats``, nothing else tests a name."""

import ast
import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax._src import formats
from fp4jax._src.recipes import OperandSpec
from tests import numpy_reference, oracles

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCANNED = ("fp4jax", "kernels", "experiments")
FORMAT_NAMES = {f.name for f in formats.FORMATS}


def test_a_format_cannot_be_relabelled():
  for fmt in formats.FORMATS:
    with pytest.raises(TypeError, match="name"):
      dataclasses.replace(fmt, name="nvfp4" if fmt is not formats.NVFP4 else "mxfp4")
  assert dataclasses.replace(formats.MXFP4, scale_mode="quest").name == "mxfp4"
  assert [f.name for f in formats.FORMATS] == ["nvfp4", "mxfp4", "fp8_e4m3", "fp8_e5m2", "e2m1_channel"]
  assert formats.get("fp8_e5m2") is formats.E5M2
  with pytest.raises(ValueError, match="unknown format 'fp16'.*nvfp4"):
    formats.get("fp16")


@pytest.mark.parametrize(
  "make, error, match",
  [
    (lambda: formats.NVFP4Format(block_size=15), ValueError, "NVFP4Format.block_size"),
    (lambda: formats.MXFP4Format(block_size=32.0), TypeError, "MXFP4Format.block_size"),
    (lambda: formats.MXFP4Format(scale_mode="absmax"), ValueError, "MXFP4Format.scale_mode"),
    (lambda: dataclasses.replace(fp4jax.NVFP4, scale_mode="floor"), ValueError, "NVFP4Format.scale_mode"),
    (lambda: formats.FP8Format(exponent_bits=4, mantissa_bits=4, max=448.0), ValueError, "must be 7"),
    (lambda: formats.FP8Format(exponent_bits=4, mantissa_bits=3, max=float("inf")), ValueError, "FP8Format.max"),
  ],
)
def test_constructors_validate_and_name_the_field(make, error, match):
  with pytest.raises(error, match=match):
    make()


@pytest.mark.parametrize("name", ["fp8_e4m3", "e2m1_channel", "nvfp4"])
def test_operand_spec_takes_format_objects_only(name):
  with pytest.raises(
    TypeError,
    match=r"OperandSpec\.fmt must be None or a format object: fp4jax\.formats\.NVFP4, "
    r"MXFP4, E4M3, E5M2, E2M1_CHANNEL.*" + name,
  ):
    OperandSpec(fmt=name)
  with pytest.raises(TypeError, match="fmt must be an FP8Format"):
    fp4jax.fp8.quantize_fp8(jnp.ones(4), name)


def test_fp8_formats_derive_their_grid_from_the_fields():
  e4m3, e5m2 = formats.E4M3, formats.E5M2
  assert (e4m3.name, e4m3.emin, e5m2.name, e5m2.emin) == ("fp8_e4m3", -6, "fp8_e5m2", -14)
  x = np.random.default_rng(0).standard_normal(4096).astype(np.float32) * np.float32(2.0) ** np.arange(-12, 4)[
    np.arange(4096) % 16
  ].astype(np.float32)
  np.testing.assert_array_equal(np.asarray(e4m3.round(jnp.asarray(x))), oracles.rne_e4m3(x).astype(np.float32))
  np.testing.assert_array_equal(np.asarray(e5m2.round(jnp.asarray(x))), oracles.rne_e5m2(x).astype(np.float32))


@pytest.mark.parametrize("block", [8, 16, 64])
def test_a_new_block_size_is_one_instance(block):
  """An MX-like format with other blocks is one instance (``MXFP4Format(block_size=...)``); quantize follows the OCP
  floor rule per block: e = floor(log2 amax_b) - 2 (-127 for a zero block), v = rne_e2m1(clamp(x·2^-e, ±6))·2^e."""
  fmt = formats.MXFP4Format(block_size=block)
  x = np.asarray(jax.random.normal(jax.random.key(block), (6, 128)), np.float32) * np.float32(3.0)
  x[1, :block] = 0.0  # a zero block
  xb = x.reshape(6, -1, block).astype(np.float64)
  e = numpy_reference.mx_exponents(np.max(np.abs(xb), axis=-1, keepdims=True), "floor")
  s = np.exp2(e.astype(np.float64))
  want = (oracles.rne_e2m1(np.clip(xb / s, -6, 6)) * s).reshape(x.shape)
  np.testing.assert_array_equal(np.asarray(fp4jax.fake_quantize(jnp.asarray(x), fmt), np.float64), want)
  q = fp4jax.quantize(jnp.asarray(x), fmt)
  assert q.scales.shape == (6, 128 // block) and q.scales.dtype == jnp.float8_e8m0fnu
  np.testing.assert_array_equal(np.asarray(q.scale_values(), np.float64), s[..., 0])


def _name_tests(path: pathlib.Path, root: pathlib.Path) -> list[str]:
  """Where ``path`` tests a format's name: a string literal equal to a format's name, or a comparison reading a
  ``fmt.name`` / ``fmt_name``; as ``"file:line: what"``, by line."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    where = f"{path.relative_to(root)}:{node.lineno}" if hasattr(node, "lineno") else ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in FORMAT_NAMES:
      found.append((node.lineno, f"{where}: the literal {node.value!r}"))
    if isinstance(node, ast.Compare):
      for sub in ast.walk(node):
        text = ast.unparse(sub) if isinstance(sub, (ast.Attribute, ast.Name)) else ""
        if (isinstance(sub, ast.Attribute) and sub.attr == "name" and "fmt" in text) or text.endswith("fmt_name"):
          found.append((node.lineno, f"{where}: {ast.unparse(node)}"))
          break
  return [hit for _, hit in sorted(found)]


def scan(root: pathlib.Path) -> list[str]:
  """``_name_tests`` of every Python file of ``SCANNED`` under ``root`` but the format classes' module
  (``fp4jax/formats.py``, or ``fp4jax/_src/formats.py``)."""
  exempt = {root / "fp4jax" / "formats.py", root / "fp4jax" / "_src" / "formats.py"}
  return [
    hit
    for d in SCANNED
    for path in sorted((root / d).rglob("*.py"))
    if path not in exempt
    for hit in _name_tests(path, root)
  ]


def test_no_code_outside_the_format_classes_tests_a_format_name():
  hits = scan(ROOT)
  assert not hits, "format names tested outside fp4jax/formats.py (ask the format object instead):\n" + "\n".join(hits)


def test_the_scan_finds_name_tests(tmp_path):
  (tmp_path / "kernels").mkdir()
  (tmp_path / "kernels" / "bad.py").write_text(
    'def f(spec, fmt_name):\n  a = spec.fmt.name == "x"\n  b = fmt_name != y\n  return g("mxfp4")\n'
  )
  (tmp_path / "fp4jax").mkdir()
  (tmp_path / "fp4jax" / "formats.py").write_text('NAME = "nvfp4"\n')  # the format classes may name themselves
  hits = scan(tmp_path)
  assert [h.split(": ", 1)[0] for h in hits] == ["kernels/bad.py:2", "kernels/bad.py:3", "kernels/bad.py:4"], hits
