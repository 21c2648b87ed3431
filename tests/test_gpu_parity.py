"""GPU vs CPU: jitted quantizers give the same bits on both, and GPU outputs lie on the FP4 grid.

XLA on GPU deletes convert pairs under jit, so a quantizer that relied on astype would return off-grid values
there. Runs only where a GPU is present (the device machine); skipped on CPU-only CI.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from tests import oracles

GPU = [d for d in jax.devices() if d.platform == "gpu"] if jax.default_backend() == "gpu" else []
pytestmark = pytest.mark.skipif(not GPU, reason="needs a GPU")

NV, MX = fp4jax.NVFP4, fp4jax.MXFP4
CASES = {
  "nvfp4_rtn": dict(fmt=NV),
  "nvfp4_2d": dict(fmt=NV, block_shape=(16, 16)),
  "nvfp4_4over6": dict(fmt=dataclasses.replace(NV, scale_mode="four_over_six")),
  "nvfp4_sr": dict(fmt=NV, rounding="sr"),
  "nvfp4_rht16_te_sr": dict(fmt=NV, rounding="sr", hadamard=16, hadamard_signs="te"),
  "nvfp4_eden": dict(fmt=NV, rounding="eden"),
  "mxfp4_floor": dict(fmt=MX),
  "mxfp4_rceil": dict(fmt=dataclasses.replace(MX, scale_mode="rceil")),
  "mxfp4_headroom_sr": dict(fmt=dataclasses.replace(MX, scale_mode="floor_headroom"), rounding="sr"),
  "mxfp4_quest_h32": dict(fmt=dataclasses.replace(MX, scale_mode="quest"), hadamard=32, hadamard_signs="none"),
}


# ------------------------------------------------------------------------------------------------ property harness
def parity_configs():
  """Every format x scale mode x rounding x axis as (name, fmt, kwargs); four-over-six is RTN only, MS-EDEN is
  NVFP4 absmax 1x16 only (with its 128-point Hadamard)."""
  out = []
  for fmt_name, modes in (
    ("nvfp4", ("absmax", "four_over_six")),
    ("mxfp4", ("floor", "rceil", "quest", "quest_nearest", "floor_headroom")),
  ):
    base = NV if fmt_name == "nvfp4" else MX
    for mode in modes:
      roundings = ("rtn",) if mode == "four_over_six" else ("rtn", "sr")
      roundings += ("eden",) if mode == "absmax" else ()
      for rounding in roundings:
        for axis in (0, -1):
          fmt = dataclasses.replace(base, scale_mode=mode)
          out.append((f"{fmt_name}_{mode}_{rounding}_ax{axis}", fmt, dict(rounding=rounding, axis=axis)))
  return out


def parity_inputs(seed: int, dtype) -> dict:
  """Heavy-tailed data (Student-t(3), rows scaled by logspace(-30, 30)) and extreme-range data: subnormals, values
  near FLT_MAX, zero blocks, an Inf block and a NaN block, tiny and huge values in one tensor; and negatives of
  2^-60 .. 2^-20 with a 1e30 every 16 rows and columns: scaled values (about 2^-97 times them) that underflow to -0
  (code 0x0), are subnormal (0x8, which XLA:CPU's flushed product once made 0x0) or normal."""
  rng = np.random.RandomState(seed)
  heavy = rng.standard_t(3, (128, 256)) * np.logspace(-30, 30, 128)[:, None]
  ext = rng.standard_t(3, (128, 256))
  ext[0:16] = rng.randint(-(1 << 23), 1 << 23, (16, 256)) * 2.0**-149  # subnormals
  ext[16:32] = rng.uniform(-1, 1, (16, 256)) * float(np.finfo(np.float32).max)  # near FLT_MAX
  ext[32:48] *= np.exp2(rng.randint(-149, 128, (16, 256)))  # every binade mixed
  ext[48:64] = 0.0
  ext[64:80] *= 2.0**-120
  ext[80, :32], ext[96, 32:64] = np.inf, np.nan
  ext[112, 7] = -np.inf
  tiny_tensor = rng.standard_t(3, (128, 256)) * 1e-37
  signed_zeros = -np.exp2(rng.uniform(-60, -20, (128, 256)))
  signed_zeros[:, ::16], signed_zeros[::16, :], signed_zeros[3, 5] = 1e30, 1e30, -0.0
  with np.errstate(over="ignore"):
    return {
      name: np.asarray(a.astype(np.float32)).astype(dtype)
      for name, a in (("heavy", heavy), ("extreme", ext), ("tiny", tiny_tensor), ("signed_zeros", signed_zeros))
    }


def _nan_canonical(y: np.ndarray) -> np.ndarray:
  """float32 bits with every NaN the same bits (NaN payloads are not part of the contract; GPUs make 0x7FFFFFFF)."""
  return np.where(np.isnan(y), np.float32(np.nan), y).view(np.uint32)


@functools.cache
def _parity_functions(fmt, kw_items: tuple) -> tuple:
  """The jitted quantize and fake_quantize of one config, made once: the inputs share a shape, so each device
  compiles them once per config and dtype."""
  kw = dict(kw_items)
  f = jax.jit(lambda a, k: fp4jax.quantize(a, fmt, key=k, **kw))
  g = jax.jit(lambda a, k: fp4jax.fake_quantize(a, fmt, key=k, dtype=jnp.float32, **kw))
  return f, g


def parity_outputs(device, x, fmt, kw, key) -> dict:
  """jit on ``device``: codes, scale bits, tensor scale, and fake_quantize's dequantized bits (float32 view)."""
  f, g = _parity_functions(fmt, tuple(sorted(kw.items())))
  xd, kd = jax.device_put(x, device), jax.device_put(key, device)
  q = f(xd, kd)
  y = np.asarray(g(xd, kd))
  return {
    "codes": np.asarray(q.codes),
    "scales": np.asarray(q.scales).view(np.uint8),
    "global_scale": _nan_canonical(np.asarray(q.global_scale, np.float32).reshape(1)),
    "deq": _nan_canonical(y),
  }


def assert_parity(dev_a, dev_b, seed: int, dtype, configs=None):
  """The property: for every config and input, ``parity_outputs`` are equal bit for bit on both devices."""
  key = jax.random.key(seed)
  differing = []
  for name, fmt, kw in configs or parity_configs():
    for data, x in parity_inputs(seed, dtype).items():
      a, b = parity_outputs(dev_a, x, fmt, kw, key), parity_outputs(dev_b, x, fmt, kw, key)
      differing += [
        f"{name} {data} {np.dtype(dtype)} {field}: {np.sum(a[field] != b[field])} of {a[field].size}"
        for field in a
        if not np.array_equal(a[field], b[field])
      ]
  assert not differing, "\n".join(differing)  # every difference, not only the first


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
@pytest.mark.parametrize("config", parity_configs(), ids=lambda c: c[0])
def test_property_gpu_matches_cpu_on_heavy_tailed_and_extreme_data(config, seed, dtype):
  """One config per test, so that workers share the configs."""
  assert_parity(GPU[0], jax.devices("cpu")[0], seed, dtype, [config])


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_ms_eden_gpu_matches_cpu_on_tiny_and_extreme_data(dtype):
  """MS-EDEN alone (both axes; its 128-point rotation summed in the subnormal range for the "tiny" data, where
  XLA:CPU flushes and the GPU does not): codes, scales and dequantized bits equal on both, for two seeds."""
  configs = [c for c in parity_configs() if "_eden_" in c[0]]
  for seed in (0, 1):
    assert_parity(GPU[0], jax.devices("cpu")[0], seed, dtype, configs)


def _inputs(dtype):
  rng = np.random.RandomState(0)
  x = rng.randn(256, 512) * np.exp2(rng.uniform(-8, 8, (256, 1)))
  return np.asarray(x, np.float32).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_cpu_bit_for_bit(name, dtype):
  kw = dict(CASES[name])
  fmt = kw.pop("fmt")
  x = _inputs(dtype)
  key = jax.random.key(3)
  f = lambda a, k: fp4jax.quantize(a, fmt, key=k, **kw)
  cpu = jax.devices("cpu")[0]
  qg = jax.jit(f)(jax.device_put(x, GPU[0]), jax.device_put(key, GPU[0]))
  qc = jax.jit(f)(jax.device_put(x, cpu), jax.device_put(key, cpu))
  # EDEN's correction and QuEST's std sum in a fixed pairwise order (fp4jax.reductions): exact too.
  np.testing.assert_array_equal(np.asarray(qg.codes), np.asarray(qc.codes))
  np.testing.assert_array_equal(np.asarray(qg.scales).view(np.uint8), np.asarray(qc.scales).view(np.uint8))
  np.testing.assert_array_equal(np.asarray(qg.global_scale), np.asarray(qc.global_scale))


def test_e4m3_roundings_match_cpu_on_every_bf16_value():
  """The block-scale roundings (bit arithmetic, no convert) give the CPU's bits under jit on the GPU."""
  x = np.arange(2**16, dtype=np.uint16).view(jnp.bfloat16).astype(np.float32)
  bits = np.asarray(fp4jax.bits.random_bits(jax.random.key(5), x.shape))
  cpu = jax.devices("cpu")[0]
  for f in (lambda a, b: fp4jax.rounding.rtn_e4m3(a), lambda a, b: fp4jax.rounding.sr_e4m3(jnp.abs(a), b)):
    g = np.asarray(jax.jit(f)(jax.device_put(x, GPU[0]), jax.device_put(bits, GPU[0])))
    c = np.asarray(jax.jit(f)(jax.device_put(x, cpu), jax.device_put(bits, cpu)))
    # NaN in, NaN out on both; the GPU returns the canonical NaN, the CPU keeps the input's sign and payload
    np.testing.assert_array_equal(np.isnan(g), np.isnan(x))
    np.testing.assert_array_equal(np.isnan(c), np.isnan(x))
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(g[finite].view(np.uint32), c[finite].view(np.uint32))


@pytest.mark.parametrize("name", sorted(CASES))
def test_jitted_gpu_fake_quantize_lies_on_the_grid(name):
  kw = dict(CASES[name])
  fmt = kw.pop("fmt")
  x = jax.device_put(_inputs(np.float32), GPU[0])
  key = jax.random.key(4)
  q = jax.jit(lambda a, k: fp4jax.quantize(a, fmt, key=k, **kw))(x, key)
  y = jax.jit(lambda a, k: fp4jax.fake_quantize(a, fmt, key=k, rotated=True, dtype=jnp.float32, **kw))(x, key)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(q.dequantize(jnp.float32, rotated=True)))
  bs = q.block_shape
  scale = np.asarray(q.scale_values())
  for ax, b in zip((-1,) if len(bs) == 1 else (-1, -2), (bs[-1],) if len(bs) == 1 else (bs[1], bs[0])):
    scale = np.repeat(scale, b, axis=ax)
  scale = scale[: y.shape[0], : y.shape[1]] * np.float32(q.global_scale)
  v = np.asarray(y, np.float64) / np.where(scale == 0, 1, scale)
  grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
  assert np.all(np.isin(np.abs(np.round(v, 4)), grid)), name


def test_bf16_parts_add_up_exactly_under_jit_on_the_gpu():
  """The three bf16 parts of a float32 operand (``fp4jax._src.operand.matmul``'s split) survive XLA's convert
  folding."""
  rng = np.random.default_rng(0)
  x = (rng.standard_normal(1 << 16) * np.exp2(rng.integers(-60, 60, 1 << 16))).astype(np.float32)
  parts = jax.jit(fp4jax._src.operand.bf16_parts)(jax.device_put(x, GPU[0]))
  np.testing.assert_array_equal(sum(np.asarray(p, np.float64) for p in parts), x.astype(np.float64))


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_occ_bounds_match_cpu(dtype):
  x = _inputs(dtype)
  x[3, :300] = np.nan
  f = jax.jit(lambda a: fp4jax.estimators.occ_bounds(a, 0.99))
  for g, c in zip(f(jax.device_put(x, GPU[0])), f(jax.device_put(x, jax.devices("cpu")[0]))):
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(c, np.float32))


def test_ms_fp4_forward_is_a_float32_gemm_of_its_operands():
  """OCC's float32 operand times per-channel E2M1 weights (three bf16 GEMMs on the GPU) is within fp32
  accumulation error of the exact product of the same operands."""
  x = jax.device_put(_inputs(np.float32)[:64], GPU[0])
  w = jax.device_put(np.random.RandomState(1).randn(128, 512).astype(np.float32), GPU[0])
  dn = (((1,), (1,)), ((), ()))
  y = np.asarray(jax.jit(lambda a, b: fp4jax.dot_general(a, b, dn, recipe="ms_fp4"))(x, w), np.float64)
  spec = fp4jax.recipes.get("ms_fp4")
  a = np.asarray(fp4jax._src.operand.quantize_operand(x, spec.fwd_lhs, None)[0].dequantize(), np.float64)
  b = np.asarray(fp4jax._src.operand.quantize_operand(w, spec.fwd_rhs, None)[0].dequantize(), np.float64)
  bound = np.abs(a) @ np.abs(b).T
  assert np.all(np.abs(y - a @ b.T) <= 512 * 2.0**-23 * bound)


def _div_operands() -> tuple[np.ndarray, np.ndarray]:
  """Random finite float32 bit patterns (every exponent, subnormals included) and the NVFP4 tensor-scale cases."""
  rng = np.random.RandomState(5)
  a = rng.randint(0, 0x7F800000, 1 << 16).astype(np.uint32).view(np.float32)
  b = rng.randint(1, 0x7F800000, 1 << 16).astype(np.uint32).view(np.float32)
  a = a * np.where(rng.rand(a.size) < 0.5, -1, 1).astype(np.float32)
  amax = np.float32([1e-42, 2.0**-149, 3.2e-35, 1e-30, 1.0, 448.0, 3e38])
  return np.concatenate([a, np.float32([2688.0] * amax.size)]), np.concatenate([b, amax])


def test_div_rn_under_jit_on_the_gpu_is_the_ieee_quotient():
  """``fp4jax.ieee.div_rn`` in XLA on the GPU (no Pallas): NumPy's float32 quotient (IEEE, subnormals kept), for
  traced operands and with a constant numerator, as the NVFP4 tensor scales use it."""
  from fp4jax._src.ieee import div_rn  # noqa: PLC0415

  a, b = _div_operands()
  with np.errstate(over="ignore", under="ignore"):
    want, want_const = (a / b).view(np.uint32), (np.float32(2688.0) / b).view(np.uint32)
  with jax.default_device(GPU[0]):
    traced = np.asarray(jax.jit(div_rn)(a, b)).view(np.uint32)
    const = np.asarray(jax.jit(lambda y: div_rn(jnp.float32(2688.0), y))(b)).view(np.uint32)
  np.testing.assert_array_equal(traced, want)
  np.testing.assert_array_equal(const, want_const)


def test_div_rn_on_the_gpu_keeps_ieee_zeros_infinities_and_nans():
  """``div_rn``'s float64 path on the GPU for every pair of zeros, infinities, NaN, subnormal and normal operands:
  NumPy's IEEE quotient (signed zeros and infinities), NaN where it gives NaN."""
  from fp4jax._src.ieee import div_rn  # noqa: PLC0415

  v = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -3.0, 1e-45, -2.5e-40, 3e38])
  a, b = np.repeat(v, v.size), np.tile(v, v.size)
  with np.errstate(all="ignore"):
    want = (a.astype(np.float64) / b).astype(np.float32)
  with jax.default_device(GPU[0]):
    got = np.asarray(jax.jit(div_rn)(a, b))
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  ok = ~np.isnan(want)
  np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("d", [32, 128])
def test_rotation_keeps_its_normalization_rounding_before_a_constant_multiply(d, inverse):
  """``x · H_d / sqrt(d)`` then ``· 0.75`` under jit: the GPU rounds the normalization as the CPU does. XLA would
  otherwise merge the two constants into one multiply (``0.75/sqrt(d)``) and skip a rounding."""
  from fp4jax.hadamard import hadamard, inverse_hadamard  # noqa: PLC0415

  fn = inverse_hadamard if inverse else hadamard
  rng = np.random.RandomState(d + inverse)
  x = (rng.standard_normal((64, 4 * d)) * np.exp2(rng.randint(-20, 20, (64, 1)))).astype(np.float32)
  f = jax.jit(lambda v: fn(v, d) * jnp.float32(0.75))
  out = {}
  for name, device in (("gpu", GPU[0]), ("cpu", jax.devices("cpu")[0])):
    with jax.default_device(device):
      out[name] = np.asarray(f(jax.device_put(x, device))).view(np.uint32)
  np.testing.assert_array_equal(out["gpu"], out["cpu"])


def test_four_over_six_of_blocks_with_subnormal_amax_matches_cpu():
  """Four-over-six on a tensor whose blocks nearly all have a subnormal amax (their errors scale by 2^127, one float32
  product in the kernels): GPU bits = CPU bits, for the jitted ``quantize`` (the kernels where "auto" takes them)."""
  x = oracles.subnormal_blocks_tensor()
  spec = fp4jax.QuantizeSpec(fmt=CASES["nvfp4_4over6"]["fmt"])
  outs = {}
  for name, device in (("gpu", GPU[0]), ("cpu", jax.devices("cpu")[0])):
    with jax.default_device(device):
      q = jax.jit(lambda v: fp4jax.quantize(v, spec))(jax.device_put(x, device))
      outs[name] = (np.asarray(q.unpacked_codes()), np.asarray(q.scale_values()).view(np.uint32))
  for got, want in zip(outs["gpu"], outs["cpu"]):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
  "recipe, backend, dtype",
  [(r, "xla", t) for r in ("nvfp4_rtn", "nvidia_nvfp4", "fp8") for t in (jnp.bfloat16, jnp.float16)]
  + [("nvfp4_rtn", "pallas", jnp.bfloat16)],  # the kernels read float32 or bfloat16
)
def test_a_low_precision_operand_made_in_the_same_jit_quantizes_as_stored(recipe, backend, dtype):
  """``dot_general`` of ``(x · c).astype(dtype)`` made inside the jitted program equals ``dot_general`` of that
  operand computed by another program and read from memory: y and both gradients, bit for bit. XLA:GPU drops the
  float32 -> bfloat16 -> float32 conversion pair of a fused producer and quantizer unless the quantizers read the
  operand through ``ieee.widen`` (with ``astype``, most outputs differ)."""
  dn = (((1,), (1,)), ((), ()))
  rng = np.random.RandomState(7)
  x = jax.device_put(rng.standard_normal((256, 512)).astype(np.float32), GPU[0])
  w = jax.device_put((rng.standard_normal((128, 512)) * 0.05).astype(dtype), GPU[0])
  dy = jax.device_put(rng.standard_normal((256, 128)).astype(dtype), GPU[0])
  c, key = jnp.float32(1.3711), jax.random.key(1)

  def layer(a, b, g):
    y, vjp = jax.vjp(lambda a, b: fp4jax.dot_general(a, b, dn, recipe=recipe, backend=backend, key=key), a, b)
    return (y, *vjp(g))

  fused = jax.jit(lambda x, w, g: layer((x * c).astype(dtype), w, g))(x, w, dy)
  split = jax.jit(layer)(jax.jit(lambda x: (x * c).astype(dtype))(x), w, dy)
  y_f, _, dw_f = fused
  y_s, _, dw_s = split
  np.testing.assert_array_equal(np.asarray(y_f, np.float32), np.asarray(y_s, np.float32))
  np.testing.assert_array_equal(np.asarray(dw_f, np.float32), np.asarray(dw_s, np.float32))
