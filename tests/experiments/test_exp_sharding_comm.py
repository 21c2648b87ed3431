"""Gradient communication in bfloat16 / float8_e4m3fn (``--grad-comm-dtype``): the encode / decode pair against
independent ml_dtypes oracles (bit for bit), the all-reduced sum against its rounding-error bound (``jax.vmap``
binds the axis name in process), flag validation, and a short data-parallel nvidia_nvfp4 training run on 8 CPU
devices whose quantized operands are the global program's (token-sharded recipes).
"""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from test_exp_sharding import LOSS_ATOL, STEP0_ULPS, _layout_check, _run, corpus  # noqa: F401  (corpus: a fixture)

from fp4jax_experiments import sharding, train

E4M3 = ml_dtypes.float8_e4m3fn


def _grads(n, shape=(64, 48), seed=0):
  """n shards of gradients over ~8 decades, half the elements sharing one sign across shards (no cancellation)."""
  rng = np.random.default_rng(seed)
  g = rng.standard_normal((n, *shape)) * np.exp(rng.normal(0.0, 3.0, (n, *shape)))
  g[:, : shape[0] // 2] = np.abs(g[:, : shape[0] // 2])
  return g.astype(np.float32)


def _pow2_ceil(n):
  return 1 << (n - 1).bit_length()


def _reduce(g, dtype):
  """all_reduce_sum over the leading axis of ``g`` (one row per shard), as every shard sees it."""
  out = jax.jit(jax.vmap(lambda x: sharding.all_reduce_sum({"w": x}, dtype, "data")["w"], axis_name="data"))(g)
  out = np.asarray(out)
  assert all(np.array_equal(out[0], o, equal_nan=True) for o in out)  # every shard holds the same sum
  return out[0]


# ------------------------------------------------------------------------------------------------ encode / decode
@pytest.mark.parametrize("n", [3, 4])
def test_fp8_encode_decode_match_ml_dtypes_bit_for_bit(n):
  """Encode: RNE of g·s onto E4M3 with s = 448/(2^⌈log2 n⌉·amax) (numpy fp32 ops are correctly rounded, ml_dtypes'
  cast is RNE); decode: RNE of the sum onto E4M3, times f32(2^⌈log2 n⌉·amax/448)."""
  g = _grads(n)
  amax = np.float32(np.abs(g).max())
  payload = np.asarray(sharding.comm_encode(jnp.asarray(g), "float8_e4m3fn", jnp.float32(amax), n))
  scale = np.float32(448) / (np.float32(_pow2_ceil(n)) * amax)
  want = (g * scale).astype(E4M3)
  assert payload.dtype == E4M3
  np.testing.assert_array_equal(payload.view(np.uint8), want.view(np.uint8))
  assert np.abs(payload.astype(np.float32)).max() <= 448 / _pow2_ceil(n)  # any partial sum of n stays <= 448

  total = payload.astype(np.float32).sum(0) + np.float32(0.37)  # off the grid: decode must round it
  got = np.asarray(sharding.comm_decode(jnp.asarray(total), "float8_e4m3fn", jnp.float32(amax), n))
  factor = np.float32(_pow2_ceil(n)) * amax / np.float32(448)
  np.testing.assert_array_equal(got, total.astype(E4M3).astype(np.float32) * factor)


def test_bf16_encode_decode_match_ml_dtypes_bit_for_bit():
  g = _grads(4)
  payload = np.asarray(sharding.comm_encode(jnp.asarray(g), "bfloat16", None, 4))
  np.testing.assert_array_equal(payload.view(np.uint16), g.astype(ml_dtypes.bfloat16).view(np.uint16))
  total = g.sum(0)
  got = np.asarray(sharding.comm_decode(jnp.asarray(total), "bfloat16", None, 3))
  np.testing.assert_array_equal(got, total.astype(ml_dtypes.bfloat16).astype(np.float32))


# ------------------------------------------------------------------------------------------------ all-reduce
@pytest.mark.parametrize("dtype, unit, floor", [("bfloat16", 2.0**-8, 0.0), ("float8_e4m3fn", 2.0**-4, 2.0**-10)])
@pytest.mark.parametrize("n", [3, 4, 8])
def test_all_reduced_sum_is_on_the_grid_and_within_the_rounding_bound(dtype, unit, floor, n):
  """Each rounding of a value y onto the wire grid errs by at most unit·|y| + floor (unit roundoff: bf16 2^-8
  relative; E4M3 2^-4 relative, 2^-10 absolute in the subnormal range). n payload roundings, at most n - 1 rounded
  partial sums (a reduction that rounds each hop) and the final rounding: in the scaled domain y_s = g_s·s,
  |t - Σ y_s| <= ((1 + unit)^(n+1) - 1)·Σ|y_s| + (n + 1)(1 + unit)^n·floor; the sum is t/s."""
  g = _grads(n)
  got = _reduce(g, dtype)
  amax = np.abs(g).max().astype(np.float64)
  s = 1.0 if dtype == "bfloat16" else 448.0 / (_pow2_ceil(n) * amax)
  sum_abs = np.abs(g.astype(np.float64)).sum(0) * s
  bound = ((1 + unit) ** (n + 1) - 1) * sum_abs + (n + 1) * (1 + unit) ** n * floor
  err = np.abs(got.astype(np.float64) * s - g.astype(np.float64).sum(0) * s)
  assert np.all(err <= bound * (1 + 2.0**-20) + 1e-30 * s), float(np.max(err / np.maximum(bound, 1e-300)))
  # on the grid: the scaled sum t = sum·s is a bf16 / E4M3 value (up to the fp32 decode rounding)
  t = got.astype(np.float64) * s
  grid = t.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else E4M3).astype(np.float64)
  np.testing.assert_allclose(t, grid, rtol=2.0**-20, atol=0)
  assert np.mean(err > 0) > 0.1  # the communication really is lossy (fp32 all-reduce would be exact here)
  if dtype == "float8_e4m3fn":  # |g·s| <= 2^-10 on every shard flushes to 0: the documented dynamic range
    tiny = np.abs(g).max(0) * s < 2.0**-10 * (1 - 2.0**-20)
    assert tiny.sum() > 10
    assert np.all(got[tiny] == 0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8_e4m3fn"])
def test_reduce_scattered_slices_are_the_all_reduced_sum_slices(dtype):
  """FSDP's gradients (a leaf sharded over "data" along its columns) reduce-scattered in ``dtype``: every shard's
  slice equals that slice of the all-reduced sum bit for bit (the same wire rounding, scale and sum); a replicated
  leaf is all-reduced."""
  from jax.sharding import PartitionSpec as P

  g = _grads(4, shape=(8, 16))
  specs = {"w": P(None, "data"), "b": P()}
  reduce = lambda x: sharding.reduce_gradients({"w": x, "b": x[0]}, specs, dtype, "data")  # noqa: E731
  out = jax.jit(jax.vmap(reduce, axis_name="data"))(g)
  full, row = _reduce(g, dtype), _reduce(g[:, 0], dtype)  # the leaves all-reduced, each with its own FP8 scale
  for shard in range(4):
    np.testing.assert_array_equal(np.asarray(out["w"][shard]), full[:, 4 * shard : 4 * (shard + 1)])
    np.testing.assert_array_equal(np.asarray(out["b"][shard]), row)


def test_reduce_gradients_refuses_an_unknown_wire_dtype():
  from jax.sharding import PartitionSpec as P

  with pytest.raises(ValueError, match=r"dtype must be one of \('float32', 'bfloat16', 'float8_e4m3fn'\), got 'f16'"):
    sharding.reduce_gradients({"w": np.zeros(2)}, {"w": P()}, "f16", "data")


def test_fp32_all_reduce_is_the_plain_sum():
  """Four fp32 terms: the reduction's result is within 3 roundings (2^-24 relative to Σ|g| each) of the exact sum."""
  g = _grads(4)
  exact = g.astype(np.float64).sum(0)
  assert np.all(np.abs(_reduce(g, "float32") - exact) <= 3 * 2.0**-24 * np.abs(g.astype(np.float64)).sum(0))


def test_fp8_sum_cannot_overflow_for_odd_shard_counts():
  """n = 3 shards all at +amax: each encodes to 448/4 = 112, the sum 336 rounds (tie, to even) to 320, no NaN;
  decoded as 320·f32(4·2.5/448)."""
  g = np.full((3, 4, 16), 2.5, np.float32)
  np.testing.assert_array_equal(_reduce(g, "float8_e4m3fn"), np.float32(320) * (np.float32(10) / np.float32(448)))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_gradient_in_one_shard_is_not_hidden(bad):
  """FP8: the shared scale becomes NaN (pmax sees +Inf for the poisoned shard), so the whole sum is NaN, as a
  non-finite amax makes any current-scaled tensor NaN. bf16: the poisoned element only."""
  g = _grads(4)
  g[2, 5, 7] = bad
  assert np.isnan(_reduce(g, "float8_e4m3fn")).all()
  got = _reduce(g, "bfloat16")
  assert not np.isfinite(got[5, 7]) and np.isfinite(np.delete(got.ravel(), 5 * 48 + 7)).all()


def test_zero_gradient_stays_zero():
  assert not np.any(_reduce(np.zeros((4, 8, 16), np.float32), "float8_e4m3fn"))


# ------------------------------------------------------------------------------------------------ the flag
def test_flag_is_rejected_where_it_does_not_apply(capsys, tmp_path):
  with pytest.raises(ValueError, match="grad_comm_dtype='float16' must be one of"):
    train.TrainConfig(grad_comm_dtype="float16")
  sharding.check_grad_comm("float32", None)
  sharding.check_grad_comm("bfloat16", sharding.Layout(data=4))
  sharding.check_grad_comm("float8_e4m3fn", sharding.Layout(data=2, fsdp=True))
  for layout, shown in [
    (None, "one device"),
    (sharding.Layout(model=2), "--mesh model=2"),
    (sharding.Layout(data=2, model=2), "--mesh data=2,model=2"),
    (sharding.Layout(data=2, model=2, fsdp=True), "--mesh data=2,model=2 fsdp"),
  ]:
    with pytest.raises(ValueError, match=f"--grad-comm-dtype float8_e4m3fn .*data-parallel mesh.*got {shown}"):
      sharding.check_grad_comm("float8_e4m3fn", layout)
  with pytest.raises(SystemExit):
    train.main(["--grad-comm-dtype", "bfloat16", "--out", str(tmp_path / "run")])
  assert "--grad-comm-dtype bfloat16 compresses" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    train.main(["--grad-comm-dtype", "float16"])
  assert "--grad-comm-dtype: invalid choice" in capsys.readouterr().err


def test_runs_saved_before_the_flag_resume(tmp_path):
  """An older config.json has no grad_comm_dtype: it takes the default (float32), the run is the same run."""
  config = train.TrainConfig()
  saved = {k: v for k, v in vars(config).items() if k != "grad_comm_dtype"}
  (tmp_path / "config.json").write_text(json.dumps(saved))
  train.RunFolder(tmp_path, config).close()
  with pytest.raises(ValueError, match="grad_comm_dtype"):
    train.RunFolder(tmp_path, train.TrainConfig(grad_comm_dtype="bfloat16"))


# ------------------------------------------------------------------------------------------------ 8 CPU devices
@pytest.mark.slow
def test_data_parallel_training_with_fp8_gradients(corpus):  # noqa: F811
  """The cheaper form of the test below: float8_e4m3fn only (the scaled wire format: shared amax, flush to zero;
  bfloat16 is a plain cast), one compile less."""
  _check_compressed_training(corpus, ["float8_e4m3fn"], ["f8E4M3FN"])


@pytest.mark.slow
def test_data_parallel_training_with_compressed_gradients(corpus):  # noqa: F811
  """bfloat16 and float8_e4m3fn on the wire, against one device: see ``_check_compressed_training``."""
  _check_compressed_training(corpus, ["bfloat16", "float8_e4m3fn"], ["bf16", "f8E4M3FN"])


def _check_compressed_training(corpus, dtypes, wires):  # noqa: F811
  """data=4, nvidia_nvfp4 (SR, 16-point RHT along tokens, 2D weight tiles), 3 steps against one device.

  Each shard differentiates its share of the loss with token-sharded recipes (cross-shard NVFP4 amax, random bits
  of global indices, the same key on every shard), so every quantized operand is the one-device operand
  (tests/test_shard_numerics.py) and the step-0 loss, which does not depend on the communicated gradient, differs
  from one device only by the fp32 order of the loss sum (STEP0_ULPS, as for the fp32 layouts). Measured on this
  model: 4 ulps, as the fp32 global program on data=4. This bound is necessary, not sufficient: the former per-shard
  quantization (local amax, shard-folded keys) gave 93 ulps at step 0 (1.7e-4 absolute at step 1), within both
  bounds here; the bit-level evidence, with a negative control, is tests/test_shard_numerics.py. The program asks
  for all-reduces in the wire dtype. Later losses: the communicated gradient differs from the fp32 one by at most
  2^-8 (bf16) / 2^-3 (E4M3)
  relative per element (bound above) plus the E4M3 flush; Adam's first updates are η·g/(|g|+ε) ≈ η·sign(g), which
  such errors change only where a coordinate flushes to zero or is comparable to ε, and the bf16 forward then
  rounds most of those parameter changes away. The resulting drift is of the size of the fp32-reordering drift
  between layouts, so the layouts' bound LOSS_ATOL applies.
  """
  overrides = {"n_layers": 1, "d_model": 64, "n_heads": 2, "ffn_hidden": 128}
  records = _layout_check(
    "--checks",
    "loss",
    "--recipes",
    "nvidia_nvfp4",
    "--meshes",
    "data=4",
    "--data",
    corpus,
    "--model-overrides",
    json.dumps(overrides),
    "--steps",
    "3",
    "--grad-comm-dtypes",
    ",".join(dtypes),
  )
  assert [r["grad_comm_dtype"] for r in records] == dtypes
  for r, wire in zip(records, wires, strict=True):
    losses, reference = np.float32(r["losses"]), np.float32(r["reference"])
    assert wire in r["all_reduce_dtypes"], r
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], r
    step0_ulps = abs(int(losses[:1].view(np.int32)[0]) - int(reference[:1].view(np.int32)[0]))
    assert step0_ulps <= STEP0_ULPS["data=4"], r
    np.testing.assert_allclose(losses, reference, rtol=0, atol=LOSS_ATOL, err_msg=str(r))
    assert r["grad_norms"][0] != r["reference_grad_norms"][0], r  # the communicated gradient is not fp32's


KERNELS_ON_A_MESH = """
import json, sys
import jax
from fp4jax_experiments import sharding, train

def run(backend):
  config = train.TrainConfig(model="100K", recipe="nvidia_nvfp4", data=sys.argv[1], batch_size=4, seq_len=32,
                             tokens=4 * 32 * 2, grad_comm_dtype=sys.argv[2])
  overrides = {"n_layers": 1, "d_model": 64, "n_heads": 2, "ffn_hidden": 128, "quantizer_backend": backend}
  trainer = train.Trainer(config, layout=sharding.Layout(data=2), model_overrides=overrides)
  state, losses = trainer.init_state(), []
  inputs = [(trainer.place(trainer.stream.batch(s)), trainer.quant_key(s)) for s in range(2)]
  step = str(trainer.train_step.trace(state, *inputs[0]).jaxpr)
  kernels, shard_map = step.count("pallas_call"), "shard_map" in step
  if sys.argv[3] == "trace":
    return {"kernels": kernels, "shard_map": shard_map, "backend": trainer.model_config.quantizer_backend}
  eval_args = (state["params"], inputs[0][0], trainer.quant_key(0))
  eval_kernels = str(trainer.eval_loss.trace(*eval_args).jaxpr).count("pallas_call")
  for tokens, key in inputs:
    state, metrics = trainer.train_step(state, tokens, key)
    losses.append(float(metrics["loss"]))
  evals = [float(trainer.eval_loss(state["params"], tokens, key)) for tokens, key in inputs]
  return {"losses": losses, "kernels": kernels, "shard_map": shard_map, "evals": evals, "eval_kernels": eval_kernels}

print(json.dumps({backend: run(backend) for backend in ("xla", "pallas")}))
"""


def test_fp4_data_parallel_steps_take_the_kernels_by_default(corpus):  # noqa: F811
  """data=2 with float32 gradients (the default): an FP4 model's step runs under shard_map with a kernel per
  quantized token shard; with quantizer_backend="xla" it stays the plain sharded jit with XLA's quantizers (traced
  only; the slow-tier test below trains both)."""
  got = json.loads(_run(["-c", KERNELS_ON_A_MESH, corpus, "float32", "trace"], devices=2).strip().splitlines()[-1])
  assert got["pallas"]["shard_map"] and got["pallas"]["kernels"] > 0, got
  assert not got["xla"]["shard_map"] and got["xla"]["kernels"] == 0, got
  assert got["pallas"]["backend"] == "pallas" and got["xla"]["backend"] == "xla", got


@pytest.mark.slow
def test_data_parallel_steps_with_the_kernels_per_shard_give_the_xla_losses(corpus):  # noqa: F811
  """data=2 under shard_map (here with ``--grad-comm-dtype bfloat16``, so that both backends take that path),
  nvidia_nvfp4 (tensor amax, SR of the gradients at their global indices, 16-point RHT along the tokens): with
  ``quantizer_backend="pallas"`` every token shard's operands go through the kernels (interpret mode here) with the
  collective amax, and the two steps' losses equal the XLA quantizers' bit for bit (the same quantized operands, the
  same program otherwise). Evaluation (``eval_loss``: the plain sharded jit, which cannot partition a Pallas kernel
  on a GPU) runs XLA's quantizers either way: no kernel, and the same evaluation losses of the trained parameters.
  (The float32 default takes the same shard_map step: the test above; its losses against one device:
  test_exp_sharding.py's data=4 layouts.)"""
  out = _run(["-c", KERNELS_ON_A_MESH, corpus, "bfloat16", "train"], devices=2)
  got = json.loads(out.strip().splitlines()[-1])
  assert got["xla"]["kernels"] == 0 and got["pallas"]["kernels"] > 0, got
  assert got["xla"]["shard_map"] and got["pallas"]["shard_map"], got
  assert got["pallas"]["losses"] == got["xla"]["losses"], got
  assert got["xla"]["eval_kernels"] == got["pallas"]["eval_kernels"] == 0, got
  assert got["pallas"]["evals"] == got["xla"]["evals"] and np.all(np.isfinite(got["xla"]["evals"])), got


FSDP_ON_A_MESH = """
import json, re, sys
import jax, numpy as np
from fp4jax_experiments import sharding, train

def run(fsdp):
  config = train.TrainConfig(model="100K", recipe="nvidia_nvfp4", data=sys.argv[1], batch_size=4, seq_len=32,
                             tokens=4 * 32 * 2, grad_comm_dtype="bfloat16")
  overrides = {"n_layers": 1, "d_model": 64, "n_heads": 2, "ffn_hidden": 128, "quantizer_backend": "xla"}
  trainer = train.Trainer(config, layout=sharding.Layout(data=2, fsdp=fsdp), model_overrides=overrides)
  state, losses = trainer.init_state(), []
  inputs = [(trainer.place(trainer.stream.batch(s)), trainer.quant_key(s)) for s in range(2)]
  lowered = trainer.train_step.lower(state, *inputs[0])
  hlo = lowered.compile().as_text()
  # the reduce-scatters the program asks for (XLA:CPU then reduces in f32)
  pattern = r'"stablehlo\\.reduce_scatter".*?\\}\\) : \\(tensor<(?:[0-9]+x)*([a-zA-Z0-9]+)>'
  wire = re.findall(pattern, lowered.as_text(), re.S)
  loss, grads = jax.jit(trainer.value_and_grad)(state["params"], *inputs[0])
  grads = [np.asarray(g).tolist() for g in jax.tree.leaves(grads)]
  for tokens, key in inputs:
    state, metrics = trainer.train_step(state, tokens, key)
    losses.append(float(metrics["loss"]))
  kernel = state["params"]["blocks"]["mlp"]["up"]["kernel"]
  params = [np.asarray(x).tolist() for x in jax.tree.leaves(state["params"])]
  collectives = {op: sorted(d) for op, d in sharding.collective_dtypes(hlo).items()}
  return {"losses": losses, "grads": grads, "params": params, "collectives": collectives,
          "sharding": str(kernel.sharding.spec), "reduce_scatter_wire": sorted(set(wire))}

print(json.dumps({"dp": run(False), "fsdp": run(True)}))
"""


# slow tier; default representative: test_reduce_scattered_slices_are_the_all_reduced_sum_slices (FSDP's gradient
# reduction, every wire dtype) and test_flag_is_rejected_where_it_does_not_apply (the flag takes --fsdp)
@pytest.mark.slow
def test_fsdp_under_shard_map_gives_data_parallel_bits(corpus):  # noqa: F811
  """data=2, bf16 gradients on the wire, nvidia_nvfp4: with --fsdp the parameters stay sharded over the data axis,
  each shard all-gathers them whole (exact) and reduce-scatters their gradients in bf16 (the same rounded sums as
  the all-reduce's slices), so the gradients and the losses equal plain data parallelism's bit for bit. The
  trained parameters agree to float32 rounding: the optimizer's global-norm clip sums the squared gradients per
  shard first (another fp32 order), which scales every update by a factor a few ulps apart."""
  got = json.loads(_run(["-c", FSDP_ON_A_MESH, corpus], devices=2).strip().splitlines()[-1])
  assert got["fsdp"]["grads"] == got["dp"]["grads"]
  assert got["fsdp"]["losses"] == got["dp"]["losses"] and np.all(np.isfinite(got["dp"]["losses"])), got["dp"]
  for a, b in zip(got["fsdp"]["params"], got["dp"]["params"], strict=True):
    np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=2e-6, atol=1e-9)
  assert "data" in got["fsdp"]["sharding"] and "data" not in got["dp"]["sharding"], (got["fsdp"], got["dp"])
  assert got["fsdp"]["reduce_scatter_wire"] == ["bf16"] and got["dp"]["reduce_scatter_wire"] == []
  assert "all-gather" in got["fsdp"]["collectives"] and "reduce-scatter" not in got["dp"]["collectives"]


PER_BLOCK_SUMS = """
import json, sys
import jax, numpy as np
from fp4jax_experiments import sharding, train

def psums_in_loops(jaxpr, inside=False):
  # (psums inside a scan's body, psums outside any scan) of a jaxpr and the jaxprs in its equations' parameters
  counts = [0, 0]
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "psum":
      counts[0 if inside else 1] += 1
    for p in eqn.params.values():
      for sub in p if isinstance(p, (tuple, list)) else [p]:
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          c = psums_in_loops(sub, inside or eqn.primitive.name == "scan")
          counts = [counts[0] + c[0], counts[1] + c[1]]
  return counts

def run(grad_sum, dtype, recipe):
  config = train.TrainConfig(model="100K", recipe=recipe, data=sys.argv[1], batch_size=4, seq_len=32,
                             tokens=4 * 32 * 2, grad_comm_dtype=dtype)
  # quantizer_backend "auto" (XLA's quantizers on a CPU): the shard_map step, also for float32
  overrides = {"n_layers": 2, "d_model": 64, "n_heads": 2, "ffn_hidden": 128, "grad_sum": grad_sum, "bf16_last": 1}
  trainer = train.Trainer(config, layout=sharding.Layout(data=2), model_overrides=overrides)
  state = trainer.init_state()
  tokens, key = trainer.place(trainer.stream.batch(0)), trainer.quant_key(0)
  psums = psums_in_loops(jax.make_jaxpr(trainer.value_and_grad)(state["params"], tokens, key).jaxpr)
  loss, grads = jax.jit(trainer.value_and_grad)(state["params"], tokens, key)
  return {"loss": float(loss), "grads": [np.asarray(g).tolist() for g in jax.tree.leaves(grads)],
          "paths": [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(grads)],
          "psums": psums}

out = {}
for dtype in ("float32", "bfloat16"):
  out[dtype] = {g: run(g, dtype, "nvidia_nvfp4") for g in ("per_block", "after_backward")}
print(json.dumps(out))
"""


# slow tier; default representative: test_sum_in_backward_is_the_identity_with_summed_cotangents
@pytest.mark.slow
def test_per_block_gradient_sums_are_the_sums_after_the_backward_pass(corpus):  # noqa: F811
  """data=2 under shard_map, nvidia_nvfp4 with a BF16 last block (two layer stacks): with ``grad_sum="per_block"``
  (the default) each block's parameter gradients are summed inside the backward pass's layer loops, and only the
  embedding, final norm and head after it; the gradients equal "after_backward"'s (every leaf summed after the
  backward pass) bit for bit, in float32 and in bfloat16 on the wire (elementwise roundings), and so does the
  loss."""
  got = json.loads(_run(["-c", PER_BLOCK_SUMS, corpus], devices=2).strip().splitlines()[-1])
  for dtype, runs in got.items():
    per_block, after = runs["per_block"], runs["after_backward"]
    assert per_block["paths"] == after["paths"]
    leaves = len(per_block["paths"])
    stacked = sum("blocks'" in p for p in per_block["paths"])  # 'blocks' and 'last_blocks' leaves
    assert 0 < stacked < leaves
    # per block: the stacks' leaves summed in the loops, the other leaves (and the loss) after; after_backward: all
    # leaves and the loss after the backward pass, none in a loop
    assert per_block["psums"][0] >= stacked and per_block["psums"][1] == leaves - stacked + 1, (dtype, per_block)
    assert after["psums"] == [0, leaves + 1], (dtype, after)
    assert per_block["grads"] == after["grads"], dtype
    assert per_block["loss"] == after["loss"]
    assert any(np.any(np.asarray(g) != 0) for g in per_block["grads"])


def test_per_block_sums_refuse_fp8_gradients():
  with pytest.raises(ValueError, match="per-block gradient sums take float32 or bfloat16 gradients, got 'float8"):
    sharding.block_grad_sum("float8_e4m3fn")


def test_per_block_sums_refuse_fsdp_and_unknown_stacks():
  """``summed`` is refused with FSDP's reduce-scatters, and a name that is no top-level parameter is an error at
  trace time (its gradients would otherwise be summed twice or not at all, silently)."""
  from jax.sharding import PartitionSpec as P

  loss = lambda params, rows, key, total: jnp.sum(params["blocks"] * params["head"]) * rows.sum() / total
  with pytest.raises(ValueError, match=r"with FSDP \(param_specs\) they reduce-scatter"):
    sharding.data_parallel_value_and_grad(loss, None, "float32", {"blocks": P(), "head": P()}, summed=("blocks",))
  mesh = jax.make_mesh((1,), (sharding.DATA,))
  step = sharding.data_parallel_value_and_grad(loss, mesh, "float32", summed=("block",))
  params = {"blocks": jnp.ones(3), "head": jnp.ones(3)}
  want = r"summed names \['block'\], which are not top-level parameters \(have \['blocks', 'head'\]\)"
  with pytest.raises(ValueError, match=want):
    put = lambda x, spec: jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
    jax.jit(step)(put(params, P()), put(jnp.ones((2, 4)), P(sharding.DATA, None)), jax.random.key(0))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sum_in_backward_is_the_identity_with_summed_cotangents(dtype):
  """Forward: the tree itself. Backward: each cotangent leaf summed over the 2 shards of the axis (bound by vmap),
  as all_reduce_sum specifies; oracle (ml_dtypes): a + b in float32, for bfloat16 of the bf16-rounded a and b,
  rounded to bf16 again (a sum of two is one rounding in any order)."""
  x = {"a": jnp.asarray(_grads(2, (5, 4), seed=1)), "b": jnp.asarray(_grads(2, (7,), seed=2))}
  weights = {"a": _grads(2, (5, 4), seed=3), "b": _grads(2, (7,), seed=4)}
  loss = lambda t, w: sum(jnp.sum(t[k] * w[k]) for k in t)  # noqa: E731  (gradient: the weights)
  fn = sharding.block_grad_sum(dtype, "data")
  y = jax.vmap(fn, axis_name="data")(x)
  assert all(np.array_equal(y[k], x[k]) for k in x)
  grads = jax.vmap(jax.grad(lambda t, w: loss(fn(t), w)), axis_name="data")(x, jax.tree.map(jnp.asarray, weights))
  for k, w in weights.items():
    if dtype == "bfloat16":
      w = w.astype(ml_dtypes.bfloat16).astype(np.float32)
    want = w[0] + w[1]
    if dtype == "bfloat16":
      want = want.astype(ml_dtypes.bfloat16).astype(np.float32)
    for shard in range(2):
      np.testing.assert_array_equal(np.asarray(grads[k][shard]), want)
