"""Formats are objects (issue 29, item 4): behaviour lives in ``fp4jax.formats``, nothing else tests a name."""

import ast
import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import ml_dtypes
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
  assert [f.name for f in formats.FORMATS] == [
    "nvfp4",
    "mxfp4",
    "fp8_e4m3",
    "fp8_e5m2",
    "e2m1_channel",
    "mxfp8_e4m3",
    "fp8_e4m3_block",
  ]
  assert dataclasses.replace(formats.FP8_BLOCK, block_size=64).name == "fp8_e4m3_block"
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


@pytest.mark.parametrize(  # slow tier; default representative: [8] (a block size below the hardware's, 16 per row)
  "block", [8, *(pytest.param(b, marks=pytest.mark.slow) for b in (16, 64))]
)
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


def test_repr_names_the_format_then_its_fields():
  """The documented repr (``Format``'s docstring): the class, ``name=`` first, then every field in order."""
  assert repr(formats.NVFP4) == "NVFP4Format(name='nvfp4', block_size=16, scale_mode='absmax')"
  assert repr(formats.MXFP4Format(block_size=16, scale_mode="quest")) == (
    "MXFP4Format(name='mxfp4', block_size=16, scale_mode='quest')"
  )
  assert repr(formats.E4M3) == "FP8Format(name='fp8_e4m3', exponent_bits=4, mantissa_bits=3, max=448.0)"
  assert repr(formats.E2M1_CHANNEL) == "E2M1ChannelFormat(name='e2m1_channel')"


@pytest.mark.parametrize("cls", [formats.NVFP4Format, formats.MXFP4Format])
def test_fp4_block_size_must_be_a_positive_even_int(cls):
  for bad, error in [(0, ValueError), (-2, ValueError), (1, ValueError), (15, ValueError)]:
    with pytest.raises(error, match=f"{cls.__name__}.block_size must be a positive even integer, got {bad}"):
      cls(block_size=bad)
  for bad in (True, 32.0, "32"):
    with pytest.raises(TypeError, match=f"{cls.__name__}.block_size must be an int"):
      cls(block_size=bad)
  assert [cls(block_size=b).block_size for b in (2, 4, 6, 48)] == [2, 4, 6, 48]


def test_fp8_format_fields_are_checked():
  for e, m in [(0, 7), (7, 0), (-1, 8), (True, 6), (4.0, 3)]:
    with pytest.raises(ValueError, match="FP8Format.(exponent|mantissa)_bits must be a positive int"):
      formats.FP8Format(exponent_bits=e, mantissa_bits=m, max=1.0)
  # The largest finite value lies below 2^(emax + 1), emax = 2^(E-1) when the top binade holds finite values (E4M3):
  # 2^9 for E4M3, 2^17 for E5M2, 2^2 for E1M6.
  for e, bound in [(4, 2.0**9), (5, 2.0**17), (1, 4.0)]:
    for bad in (bound, 2 * bound, 4 * bound, 0.0, -1.0, float("nan")):
      with pytest.raises(ValueError, match="FP8Format.max must be a positive finite value"):
        formats.FP8Format(exponent_bits=e, mantissa_bits=7 - e, max=bad)
  ok = [(1, 6, 3.96875), (6, 1, 2.0**32 * 1.5), (4, 3, 1.0), (4, 3, 0.5), (4, 3, 480.0), (5, 2, 2.0**16 * 1.75)]
  for e, m, top in ok:
    assert formats.FP8Format(exponent_bits=e, mantissa_bits=m, max=top).max == top


# (format, its ml_dtypes type: an independent RNE oracle once the input is clipped to ±max, as FP8Format saturates)
FP8_ORACLES = [
  (formats.E4M3, ml_dtypes.float8_e4m3fn),
  (formats.E5M2, ml_dtypes.float8_e5m2),
  (formats.FP8Format(exponent_bits=3, mantissa_bits=4, max=15.5), ml_dtypes.float8_e3m4),
]


@pytest.mark.parametrize("fmt, dtype", FP8_ORACLES, ids=lambda v: getattr(v, "name", None))
def test_fp8_round_every_value_midpoint_and_neighbour_matches_ml_dtypes(fmt, dtype):
  """Every finite value of the type, each midpoint between neighbours (ties to even), the float32 numbers either side
  of it, values beyond ±max (saturate) and NaN, against ``ml_dtypes`` casts of the input clipped to ±max."""
  grid = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64)))
  grid = grid[np.isfinite(grid) & (grid <= fmt.max)]
  mids = (grid[1:] + grid[:-1]) / 2  # exact in float64 and in float32 (at most 5 significant bits)
  mids32 = mids.astype(np.float32)
  near = np.concatenate([np.nextafter(mids32, np.float32(0)), np.nextafter(mids32, np.float32(np.inf))])
  beyond = np.float32(fmt.max) * np.float32([1.0001, 1.5, 2.0, 1e6]).astype(np.float32)
  mag = np.concatenate([grid.astype(np.float32), mids32, near, beyond, [np.float32(np.finfo(np.float32).max)]])
  mag = mag[(mag == 0) | (mag >= np.finfo(np.float32).tiny)]  # float32 subnormals flush on CPU: not fp8 inputs here
  x = np.concatenate([mag, -mag, [np.float32(np.inf), -np.float32(np.inf)]]).astype(np.float32)
  want = np.clip(x, -fmt.max, fmt.max).astype(dtype).astype(np.float32)
  got = np.asarray(fmt.round(jnp.asarray(x)))
  np.testing.assert_array_equal(got, want)
  assert np.isnan(np.asarray(fmt.round(jnp.float32(np.nan))))
  assert fmt.emin == int(np.log2(float(ml_dtypes.finfo(dtype).smallest_normal)))


def test_format_class_constants_follow_the_specs():
  """NVFP4 (NVIDIA): E4M3 block scales under an FP32 tensor scale, 16-element hardware blocks; MXFP4 (OCP MX v1.0):
  E8M0 scales, no tensor scale, 32-element blocks; only QuEST reads block standard deviations; MS-EDEN's scale rule
  is NVFP4's with absmax scales only; only four-over-six rounds each block under two block scalings."""
  nv, nv46 = formats.NVFP4, formats.NVFP4Format(scale_mode="four_over_six")
  assert (nv.has_tensor_scale, nv.native_block_size, nv.scale_dtype) == (True, 16, jnp.float8_e4m3fn)
  assert (formats.MXFP4.has_tensor_scale, formats.MXFP4.native_block_size) == (False, 32)
  assert (nv.takes_eden, nv46.takes_eden, nv.needs_block_std, nv46.needs_block_std) == (True, False, False, False)
  assert (nv.block_scale_candidates, nv46.block_scale_candidates) == (1, 2)
  for mode in formats.MXFP4Format.scale_modes:
    fmt = formats.MXFP4Format(scale_mode=mode)
    assert not fmt.takes_eden and fmt.needs_block_std == mode.startswith("quest")
    assert fmt.block_scale_candidates == 1
    with pytest.raises(ValueError, match="rounding='eden' is MS-EDEN for NVFP4"):
      fp4jax.QuantizeSpec(fmt=fmt, rounding="eden")


@pytest.mark.parametrize(  # slow tier; default representative: [fmt0] (NVFP4: 16 taken, 32 and 64 refused)
  "fmt", [formats.NVFP4, pytest.param(formats.MXFP4, marks=pytest.mark.slow)]
)
def test_the_gemm_kernels_take_the_hardware_block_size_only(fmt):
  """The kernels decode the hardware's blocks (16 for NVFP4, 32 for MXFP4): any other block size is refused."""
  from fp4jax_kernels.gemm import api

  from fp4jax._src import backends

  for block, ok in [(16, fmt is formats.NVFP4), (32, fmt is formats.MXFP4), (64, False)]:
    f = dataclasses.replace(fmt, block_size=block)
    x, w = fp4jax.quantize(jnp.ones((2, 64)), f), fp4jax.quantize(jnp.ones((64, 8)), f, axis=0)
    if ok:
      a, b = api.operands(x, w, auto=False)
      assert (a.shape, b.shape) == ((2, 64), (8, 64))
    else:
      with pytest.raises(backends.Unsupported, match=f"{block}-element blocks: the kernels take"):
        api.operands(x, w, auto=False)


@pytest.mark.parametrize("amax", [1.0, 3.0, 1e-30, 0.0, 1e38])
def test_tensor_decode_scales(amax):
  """NVFP4: s_dec = 1 / s_enc, s_enc = min(2688 / amax, FLT_MAX) (1 for amax 0); MXFP4: 1, or 4/3 for the floor
  headroom mode (elements pre-scaled by 3/4)."""
  nv = formats.NVFP4
  got = nv.tensor_decode_scale(nv.tensor_scales(jnp.float32(amax), "rtn"))
  assert np.float32(got) == oracles.nvfp4_tensor_scales(amax)[1]
  assert formats.MXFP4.tensor_decode_scale(None) == np.float32(1.0)
  headroom = formats.MXFP4Format(scale_mode="floor_headroom").tensor_decode_scale(None)
  assert np.float32(headroom) == np.float32(4.0) / np.float32(3.0)


@pytest.mark.parametrize(
  "exponent_bits,mantissa_bits,good,bad",
  [(4, 3, 448.0, 447.0), (5, 2, 57344.0, 57000.0), (3, 4, 15.5, 15.25), (4, 3, 0.25, 0.2)],
)
def test_fp8_max_must_lie_on_its_grid(exponent_bits, mantissa_bits, good, bad):
  """An off-grid ``max`` would saturate to a value the format cannot hold: refused, naming the field."""
  from fp4jax._src.formats import FP8Format  # noqa: PLC0415

  assert FP8Format(exponent_bits, mantissa_bits, good).max == good
  with pytest.raises(ValueError, match=r"FP8Format.max must lie on the E\dM\d grid"):
    FP8Format(exponent_bits, mantissa_bits, bad)
