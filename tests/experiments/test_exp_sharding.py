"""Sharded training: mesh flags, partition specs, layout rejection, and equality with one device on 8 CPU devices.

The multi-device checks run in subprocesses: XLA_FLAGS=--xla_force_host_platform_device_count must be set before
jax is imported, and this pytest process has imported it already.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from fp4jax_experiments import model as model_lib
from fp4jax_experiments import optimizer, prepare, sharding, train

REPO = Path(__file__).resolve().parents[2]
# One block of d_model 256 / ffn 256 / 2 heads: the smallest shape where quartet2's 128-point backward Hadamard fits
# a tensor-parallel shard (d_model / 2 = 128). Batch 8 x seq 64: 128 tokens per shard at data=4.
OVERRIDES = {"n_layers": 1, "d_model": 256, "n_heads": 2, "ffn_hidden": 256}
FOUR_LAYOUTS = ["data=4", "data=4:fsdp", "model=2", "data=2,model=2"]
DEFAULT_LAYOUTS = ["data=4:fsdp"]  # data parallelism and FSDP in one two-compile run


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  folder = tmp_path_factory.mktemp("corpus")
  (folder / "text.txt").write_text("".join(f"line {i % 97}: the quick brown fox jumps.\n" for i in range(3000)))
  prepare.prepare_text(folder / "bytes", [folder / "text.txt"])
  return str(folder / "bytes")


def _run(args, devices=8, timeout=600, env=None):
  # conftest's XLA:CPU flags kept (compile time), the host device count added
  flags = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), f"--xla_force_host_platform_device_count={devices}"]))
  env = {**os.environ, "XLA_FLAGS": flags, **(env or {})}
  proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


def _layout_check(*args, devices=8):
  out = _run(["-m", "fp4jax_experiments.layout_check", *args], devices)
  return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


# ------------------------------------------------------------------------------------------------ in process
def test_parse_mesh_and_bad_flags():
  assert sharding.parse_mesh("data=4") == sharding.Layout(data=4)
  assert sharding.parse_mesh("data=2, model=2", fsdp=True) == sharding.Layout(2, 2, True)
  assert sharding.parse_mesh("model=2").n_devices == 2
  for bad in ("pipe=2", "data=2,data=2", "data", "data=-1"):
    with pytest.raises(ValueError, match="--mesh"):
      sharding.parse_mesh(bad)
  with pytest.raises(ValueError, match="positive"):
    sharding.parse_mesh("data=0")
  with pytest.raises(ValueError, match="fsdp"):
    sharding.parse_mesh("model=2", fsdp=True)
  with pytest.raises(ValueError, match="needs 4 devices"):
    sharding.make_mesh(sharding.Layout(data=4), devices=jax.devices()[:1])


def _state_specs(layout, **config_changes):
  config = model_lib.ModelConfig(**{**OVERRIDES, **config_changes})
  params = jax.eval_shape(lambda k: model_lib.init_params(config, k), jax.random.key(0))
  opt = optimizer.adamw(optimizer.lr_schedule(1e-3, 10))
  state = {"params": params, "opt_state": jax.eval_shape(opt.init, params)}
  return jax.tree_util.tree_map_with_path(lambda path, leaf: sharding.leaf_spec(path, leaf.shape, layout), state)


def test_partition_specs_megatron_and_fsdp():
  tp = _state_specs(sharding.Layout(data=2, model=2))["params"]
  block = tp["blocks"]  # stacked: (layers, in, out), the layer axis replicated
  for name in ("q", "k", "v"):
    assert block["attn"][name]["kernel"] == P(None, None, "model")  # column-parallel: heads split
  assert block["mlp"]["gate"]["kernel"] == block["mlp"]["up"]["kernel"] == P(None, None, "model")
  assert block["attn"]["o"]["kernel"] == block["mlp"]["down"]["kernel"] == P(None, "model", None)  # row-parallel
  assert tp["embed"]["embedding"] == tp["lm_head"]["kernel"] == P(None, None)
  assert block["attn_norm"]["scale"] == P()
  fsdp = _state_specs(sharding.Layout(data=2, model=2, fsdp=True))
  assert fsdp["params"]["blocks"]["attn"]["q"]["kernel"] == P(None, "data", "model")
  assert fsdp["params"]["blocks"]["mlp"]["down"]["kernel"] == P(None, "model", "data")
  assert fsdp["params"]["embed"]["embedding"] == P("data", None) and fsdp["params"]["lm_head"]["kernel"] == P(
    None, "data"
  )
  adam = fsdp["opt_state"][1][0]  # (clip state, (ScaleByAdamState, ...))
  assert adam.mu["blocks"]["attn"]["q"]["kernel"] == P(None, "data", "model") and adam.count == P()
  policy = _state_specs(sharding.Layout(model=2), n_layers=3, bf16_first=1, bf16_last=1)["params"]
  for stack in ("first_blocks", "blocks", "last_blocks"):
    assert policy[stack]["mlp"]["up"]["kernel"] == P(None, None, "model"), stack
  with pytest.raises(ValueError, match="no sharding rule.*'shared_expert'"):  # ("router" is MoE's: test_exp_moe.py)
    sharding.leaf_spec(
      (jax.tree_util.DictKey("blocks"), jax.tree_util.DictKey("shared_expert"), jax.tree_util.DictKey("kernel")),
      (2, 8, 8),
      sharding.Layout(model=2),
    )


def test_check_layout_rejects_straddling_blocks_and_uneven_splits():
  config = lambda recipe, **kw: model_lib.ModelConfig(**{**OVERRIDES, "recipe": recipe, **kw})  # noqa: E731
  sharding.check_layout(sharding.Layout(data=4), config("quartet2"), batch_size=8, seq_len=64)  # 128 tokens/shard
  sharding.check_layout(sharding.Layout(data=2, model=2, fsdp=True), config("quartet2"), 8, 64)
  with pytest.raises(ValueError, match=r"quartet2.*wgrad_lhs.*units of 128 along tokens.*8 shards of 64.*straddle"):
    sharding.check_layout(sharding.Layout(data=8), config("quartet2"), batch_size=8, seq_len=64)
  with pytest.raises(
    ValueError, match=r"quartet2.*dgrad_lhs operand of the q/k/v.*units of 128 along the layer outputs"
  ):
    sharding.check_layout(sharding.Layout(model=2), config("quartet2", d_model=128, n_heads=2), 8, 64)
  with pytest.raises(ValueError, match=r"quartet.*units of 32 along the layer outputs .length 256.*16 shards of 16"):
    sharding.check_layout(sharding.Layout(model=16), config("quartet", n_heads=16, ffn_hidden=256), 8, 64)
  with pytest.raises(ValueError, match=r"nvidia_nvfp4.*fwd_lhs.*units of 16 along the layer inputs .*4 shards of 8"):
    sharding.check_layout(
      sharding.Layout(data=4, fsdp=True), config("nvidia_nvfp4", d_model=32, n_heads=1, ffn_hidden=64), 8, 64
    )
  sharding.check_layout(sharding.Layout(data=8), config("bf16"), 8, 64)  # nothing quantized: no block rule
  with pytest.raises(ValueError, match="batch_size=6 does not split evenly over data=4"):
    sharding.check_layout(sharding.Layout(data=4), config("bf16"), 6, 64)
  with pytest.raises(ValueError, match="n_heads=1 does not split evenly over model=2"):
    sharding.check_layout(sharding.Layout(model=2), config("bf16", n_heads=1), 8, 64)


# slow tier; default representative: tests/kernels/test_dot_pallas.py::test_pallas_backend_matches_xla_bit_for_bit
@pytest.mark.slow
def test_training_with_the_pallas_kernels_matches_the_xla_quantizers_bit_for_bit(corpus):
  """The backends check: two training steps of nvidia_nvfp4 (RTN, 16x16 weights, RHT16 + SR gradients) with the
  projections' quantizers run by the Pallas kernels (interpret mode on the CPU) give the XLA path's losses. (The
  "pallas" backend never falls back to XLA: ``fp4jax.operand.resolve_backend`` raises where the kernel cannot run.)"""
  from fp4jax_experiments import layout_check

  config = train.TrainConfig(model="100K", data=corpus, batch_size=4, seq_len=64, tokens=4 * 64 * 2, lr=3e-3)
  (record,) = layout_check.check_backends(config, ["nvidia_nvfp4"], ["xla", "pallas"], steps=2)
  assert record["backend"] == "pallas" and len(record["losses"]) == 2
  assert record["bit_identical"], record
  assert record["grad_norms"] == record["reference_grad_norms"]  # the whole first update, not only the loss
  assert np.isfinite(record["losses"]).all() and record["losses"][0] > 1.0


# ------------------------------------------------------------------------------------------------ 8 CPU devices
# slow tier; default representative: tests/test_shard_numerics.py (each operand of the token- and feature-sharded dot)
@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["data=2,model=2", "data=4"])
def test_quantized_operands_are_bit_identical_for_every_recipe_and_layout(mesh):
  """Every quantized operand of every recipe, its rows / contraction axis split over the mesh (data=2 x model=2:
  both kinds of split; data=4: splits that cut 128-point Hadamard chunks), equals the one-device operand bit for
  bit."""
  records = _layout_check("--checks", "operands", "--meshes", mesh)
  recipes = {r["recipe"] for r in records}
  assert recipes == set(__import__("fp4jax").recipes.names()) - {"bf16"}
  assert len({(r["mesh"], r["sharding"]) for r in records}) == 2
  assert all(r["equal"] for r in records), [r for r in records if not r["equal"]]


NEGATIVE_CONTROL = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
import fp4jax
from fp4jax_experiments import sharding
mesh = sharding.make_mesh(sharding.Layout(data=4))
x = (jax.random.normal(jax.random.key(0), (64, 256)) * jnp.arange(1, 257) / 64).astype(jnp.bfloat16)
q = lambda x: fp4jax.fake_quantize(x, fp4jax.NVFP4, axis=-1)
per_shard = jax.jit(jax.shard_map(q, mesh=mesh, in_specs=P(None, "data"), out_specs=P(None, "data")))(x)
print(int(jnp.sum(per_shard != jax.jit(q)(x))))
"""


# slow tier; default representative: test_shard_numerics.py::test_the_plain_recipe_under_shard_map_would_be_detected
@pytest.mark.slow
def test_per_shard_quantization_would_be_detected():
  """Negative control: a quantizer that saw only its shard (local NVFP4 tensor amax) differs from the logical one,
  so the bit-equality above is a real check of global numerics."""
  assert int(_run(["-c", NEGATIVE_CONTROL], devices=4).split()[-1]) > 0


# Worst |loss - one-device loss| over 3 steps, measured on CPU (see the module docstring of experiments.layout_check
# and the report): DP/FSDP differ only by the fp32 order of the token sums (wgrad all-reduce, loss mean); TP by the
# row-parallel GEMMs' partial sums, which then move some bf16 roundings by one bf16 ulp; the differences grow through
# Adam's normalized updates. The step-0 loss (before any update) differs by at most this many fp32 ulps.
# Since the blocks run under nn.scan, XLA also picks other collectives for the carried hidden state
# (collective-permute / all-to-all), which reorders more sums: measured worst 2.32e-3 (nvidia_nvfp4, DPxTP, step 3)
# and 146 ulps at step 0 (bf16, data=4). The quantized operands themselves are bit-identical (test above), and
# --deterministic R makes the losses bit-identical on data-parallel and FSDP meshes (test_exp_deterministic.py).
LOSS_ATOL = 5e-3
STEP0_ULPS = {"data=4": 256, "data=4 fsdp": 256}


# By default bf16 on data=4 with FSDP (two compiles); the other three layouts (five compiles in all) and nvidia_nvfp4
# (FP4 train-step compiles: the partitioned jit on DP x TP, the shard_map step on data=4) run in the slow tier.
@pytest.mark.parametrize(
  "recipes,meshes",
  [
    # slow tier; default representative: test_exp_deterministic.py's [bf16] DP x TP x FSDP mesh (bit for bit)
    pytest.param("bf16", DEFAULT_LAYOUTS, marks=pytest.mark.slow),
    pytest.param("nvidia_nvfp4", ["data=2,model=2:fsdp"], marks=pytest.mark.slow),
    pytest.param("bf16", [m for m in FOUR_LAYOUTS if m not in DEFAULT_LAYOUTS], marks=pytest.mark.slow),
    # an FP4 model on a data-parallel mesh: the shard_map step with token-sharded recipes (the default there)
    pytest.param("nvidia_nvfp4", ["data=4"], marks=pytest.mark.slow),
    # an FP4 model on a model axis alone: the Megatron shards under shard_map (the default there)
    pytest.param("nvidia_nvfp4", ["model=2"], marks=pytest.mark.slow),
    # and beside a data axis: the Megatron shards with token-sharded recipes, the batch split over "data"
    pytest.param("nvidia_nvfp4", ["data=2,model=2"], marks=pytest.mark.slow),
  ],
)
def test_sharded_losses_match_one_device(corpus, recipes, meshes):
  records = _layout_check(
    "--checks",
    "loss",
    "--recipes",
    recipes,
    "--meshes",
    *meshes,
    "--data",
    corpus,
    "--model-overrides",
    json.dumps(OVERRIDES),
    "--steps",
    "3",
  )
  assert len(records) == len(recipes.split(",")) * len(meshes)
  for r in records:
    losses, reference = np.float32(r["losses"]), np.float32(r["reference"])
    assert np.all(np.isfinite(losses)) and reference[-1] < reference[0], r
    np.testing.assert_allclose(losses, reference, rtol=0, atol=LOSS_ATOL, err_msg=str(r))
    if r["mesh"] in STEP0_ULPS:
      assert abs(int(losses[:1].view(np.int32)[0]) - int(reference[:1].view(np.int32)[0])) <= STEP0_ULPS[r["mesh"]]
    assert set(r["collectives"].get("all-reduce", [])) <= {"f32", "pred", "s32", "u32"}, r["collectives"]


TENSOR_PARALLEL_STEP = """
import json, sys
from fp4jax_experiments import sharding, train

def run(backend, layout):
  config = train.TrainConfig(model="100K", recipe="nvidia_nvfp4", data=sys.argv[1], batch_size=4, seq_len=32,
                             tokens=4 * 32 * 2)
  overrides = {"n_layers": 1, "d_model": 64, "n_heads": 2, "ffn_hidden": 128, "quantizer_backend": backend}
  mesh, _, fsdp = layout.partition(" ")
  trainer = train.Trainer(config, layout=sharding.parse_mesh(mesh, fsdp=bool(fsdp)), model_overrides=overrides)
  state = trainer.init_state()
  jaxpr = trainer.train_step.trace(state, trainer.place(trainer.stream.batch(0)), trainer.quant_key(0)).jaxpr
  step = str(jaxpr)
  # the NVFP4 tensor amax of a split operand is a pmax over the shards (fp4jax.sharding.combine_amax); beside a data
  # axis the amax of an operand split both ways is one pmax over both axes, and the step's batch is split over "data"
  return {"shard_map": "shard_map" in step, "collective_amax": "pmax" in step,
          "amax_over_both_axes": "axes=('data', 'model')" in step, "backend": trainer.model_config.quantizer_backend}

cases = [("auto", "model=2"), ("xla", "model=2"), ("auto", "data=2,model=2"), ("auto", "data=2,model=2 fsdp")]
print(json.dumps({f"{backend} {layout}": run(backend, layout) for backend, layout in cases}))
"""


def test_fp4_tensor_parallel_steps_run_the_megatron_shards_by_default(corpus):
  """--mesh model=2, data=2,model=2 and data=2,model=2 --fsdp without --deterministic, nvidia_nvfp4: the traced
  step runs the Megatron shards under shard_map (recipes marked with their split, and beside a data axis with the
  tokens too: each operand quantized as the logical tensor, the amax of an operand cut both ways over both axes, by
  the kernels where they take the slice), with quantizer_backend "auto"; with "xla" it stays the partitioned jit
  (on model=2; traced only; the losses against one device: the slow tier's [nvidia_nvfp4-meshes4], -meshes5 and
  -meshes1)."""
  got = json.loads(_run(["-c", TENSOR_PARALLEL_STEP, corpus], devices=4).strip().splitlines()[-1])
  for layout, both in (("model=2", False), ("data=2,model=2", True), ("data=2,model=2 fsdp", True)):
    want = {"shard_map": True, "collective_amax": True, "amax_over_both_axes": both, "backend": "auto"}
    assert got[f"auto {layout}"] == want, got
  xla = {"shard_map": False, "collective_amax": False, "amax_over_both_axes": False, "backend": "xla"}
  assert got["xla model=2"] == xla, got


def test_differing_leaves_names_the_parameters_that_differ():
  """``state_digests`` hashes each leaf by its path; a one-ulp change in one parameter, and a leaf on one side
  only, are named, and nothing else is."""
  from fp4jax_experiments import layout_check

  state = {"params": {"q": np.ones((2, 3), np.float32), "o": np.zeros(4, np.float32)}, "opt_state": (np.ones(2),)}
  moved = {"params": {"q": state["params"]["q"].copy(), "o": state["params"]["o"]}, "opt_state": state["opt_state"]}
  moved["params"]["q"][1, 2] = np.nextafter(np.float32(1), np.float32(2))
  digests = layout_check.state_digests(state)
  assert layout_check.differing_leaves(digests, digests) == []
  assert layout_check.differing_leaves(layout_check.state_digests(moved), digests) == ["['params']['q']"]
  extra = {**moved, "step": np.int32(0)}
  assert layout_check.differing_leaves(layout_check.state_digests(extra), digests) == ["['params']['q']", "['step']"]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# slow tier; default representative: an integration run (2 processes, gloo); sharded training:
# test_exp_deterministic's [bf16]
@pytest.mark.slow
def test_two_processes_with_jax_distributed_match_one_process(corpus, tmp_path):
  """Two CPU processes x 2 devices (jax.distributed.initialize, gloo collectives) train like one 4-device process:
  the same loss up to the all-reduce's summation order (gloo's ring vs the in-process reduction)."""
  args = [
    "-m",
    "fp4jax_experiments.train",
    "--model",
    "100K",
    "--tokens",
    "1536",
    "--data",
    corpus,
    "--batch-size",
    "8",
    "--seq-len",
    "64",
    "--log-every",
    "1",
    "--eval-every",
    "3",
    "--eval-batches",
    "1",
    "--ckpt-every",
    "3",
    "--lr",
    "3e-3",
    "--mesh",
    "data=4",
  ]
  port = _free_port()
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        *args,
        "--out",
        str(tmp_path / "two"),
        "--distributed",
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        "2",
        "--process-id",
        str(i),
      ],
      cwd=REPO,
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]
  for proc in procs:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
  _run([*args, "--out", str(tmp_path / "one")], devices=4)
  curves = [[r.get("loss", r.get("val_loss")) for r in train.read_metrics(tmp_path / name)] for name in ("two", "one")]
  assert len(curves[0]) == len(curves[1]) == 5  # val, 3 train, val
  np.testing.assert_allclose(curves[0], curves[1], rtol=4e-7, atol=0)
  assert (tmp_path / "two" / "summary.json").exists() and (tmp_path / "two" / "ckpt" / "3").exists()
