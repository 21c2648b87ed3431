"""``--deterministic R`` (experiments.deterministic): flag validation, the XLA flags it sets, and on 8 CPU devices the
same loss curve and the same trained state, bit for bit, on one device and on data-parallel, FSDP, tensor-parallel
and DP x TP meshes."""

import json

import pytest
from test_exp_sharding import OVERRIDES, _layout_check

from fp4jax_experiments import deterministic, sharding, train
from fp4jax_experiments import model as model_lib


@pytest.mark.parametrize(
  "microbatches,batch_size,mesh,comm,shards,message",
  [
    (3, 12, None, "float32", 1, "must be a power of two"),
    (4, 6, None, "float32", 1, "batch_size=6 does not split into 4 equal microbatches"),
    (4, 8, None, "bfloat16", 1, "--grad-comm-dtype must be float32"),
    (
      4,
      8,
      "data=2,model=2",
      "float32",
      1,
      "model axis \\(2 devices\\) must be 1 or --tensor-shards \\(1\\).*pass --tensor-shards 2",
    ),
    (4, 8, "model=2", "float32", 4, "model axis \\(2 devices\\) must be 1 or --tensor-shards \\(4\\)"),
    (4, 8, None, "float32", 3, "--tensor-shards 3 must be a power of two"),
    (2, 8, "data=4", "float32", 1, "the data axis \\(4 devices\\) must divide the number of microbatches"),
  ],
)
def test_layouts_and_flags_it_cannot_run_are_refused(microbatches, batch_size, mesh, comm, shards, message):
  layout = None if mesh is None else sharding.parse_mesh(mesh)
  with pytest.raises(ValueError, match=message):
    deterministic.check(microbatches, batch_size, layout, comm, shards)


def test_config_validates_the_flag():
  assert train.TrainConfig(batch_size=8, seq_len=16, tokens=128, deterministic=4).deterministic == 4
  with pytest.raises(ValueError, match="power of two"):
    train.TrainConfig(batch_size=6, deterministic=3)
  with pytest.raises(ValueError, match="deterministic=-1 must be >= 0"):
    train.TrainConfig(deterministic=-1)
  with pytest.raises(ValueError, match="tensor_shards=2 needs deterministic > 0"):
    train.TrainConfig(tensor_shards=2)


def test_microbatches_too_short_for_a_hadamard_chunk_are_refused():
  """quartet2 rotates the wgrad operands along the tokens in chunks of 128: 64-token microbatches cannot hold one,
  whatever the mesh (one device included)."""
  cfg = model_lib.model_config("100K", vocab_size=256, recipe="quartet2", **OVERRIDES)
  with pytest.raises(ValueError, match="cuts that axis into 8 microbatches of 64.*straddle two microbatches"):
    sharding.check_layout(sharding.Layout(), cfg, batch_size=8, seq_len=64, microbatches=8)
  sharding.check_layout(sharding.Layout(data=4, fsdp=True), cfg, batch_size=8, seq_len=64, microbatches=4)


def test_gpu_flags_are_appended_once_and_a_users_choice_is_kept():
  env = {"XLA_FLAGS": "--xla_gpu_autotune_level=2 --xla_force_host_platform_device_count=8"}
  deterministic.set_gpu_flags(env)
  deterministic.set_gpu_flags(env)
  assert env["XLA_FLAGS"].split() == [
    "--xla_gpu_autotune_level=2",
    "--xla_force_host_platform_device_count=8",
    "--xla_gpu_deterministic_ops=true",
  ]
  empty = {}
  deterministic.set_gpu_flags(empty)
  assert empty["XLA_FLAGS"].split() == list(deterministic.GPU_XLA_FLAGS)


def _check_bit_identical(corpus, meshes, described, recipe="nvidia_nvfp4"):  # noqa: F811
  """``recipe`` (nvidia_nvfp4: stochastic rounding with a random Hadamard, same keys), 3 steps of 4 microbatches of
  128 tokens on each of ``meshes`` against one device (with ``--tensor-shards`` T on a model axis of T devices,
  against T Megatron shards on one device, ``jax.vmap``): the same losses, gradient norms and trained state, bit for
  bit."""
  records = _layout_check(
    "--checks",
    "loss",
    "--recipes",
    recipe,
    "--meshes",
    *meshes,
    "--data",
    corpus,
    "--model-overrides",
    json.dumps(OVERRIDES),
    "--steps",
    "3",
    "--deterministic",
    "4",
  )
  assert [r["mesh"] for r in records] == described, records
  for r in records:
    assert r["bit_identical"] and r["state_identical"] and r["differing_params"] == [], r
    assert r["grad_norms"] == r["reference_grad_norms"], r
    assert r["losses"][-1] < r["losses"][0], r  # it trains


@pytest.mark.parametrize(
  "recipe",
  [
    "bf16",
    # slow tier; default representative: [bf16] (this mesh and checks), tests/test_shard_numerics.py (FP4 operands)
    pytest.param("nvfp4_rtn", marks=pytest.mark.slow),
    pytest.param("nvidia_nvfp4", marks=pytest.mark.slow),
  ],
)
def test_losses_and_trained_state_are_bit_identical_on_a_dp_fsdp_tp_mesh(corpus, recipe):  # noqa: F811
  """The default tier's representative of the test below: one mesh with every kind of split at once, data=2 x
  model=2 with FSDP (2 microbatches per data device, parameters sharded over data, two Megatron shards), against
  the one-device run of the same two shards: one compile of each (of six for the four layouts below). By default
  under bf16 (the microbatch sums, the FSDP gathers and the Megatron partial sums in a fixed order; two BF16
  compiles); nvfp4_rtn adds the quantizers' tensor amaxes across the shards, nvidia_nvfp4 SR and the random Hadamard
  at global indices (each an FP4 train-step compile of minutes on the CPU)."""
  _check_bit_identical(corpus, ["data=2,model=2:fsdp"], ["data=2,model=2 fsdp"], recipe)


# slow tier; default representative: test_losses_and_trained_state_are_bit_identical_on_a_dp_fsdp_tp_mesh[bf16]
@pytest.mark.slow
def test_losses_and_trained_state_are_bit_identical_on_every_layout(corpus):  # noqa: F811
  """One device against data=4 and data=2 with FSDP; two Megatron shards (--tensor-shards 2) on one device
  (jax.vmap) against model=2 and data=2 x model=2 (shard_map). (Every other recipe is bit-identical too, on the
  CPU: BENCHMARKS.md §9 at commit 83b474b; each adds about a minute and a half here.)"""
  _check_bit_identical(
    corpus,
    ["data=4", "data=2:fsdp", "model=2", "data=2,model=2"],
    ["data=4", "data=2 fsdp", "model=2", "data=2,model=2"],
  )


def test_pallas_quantizers_with_tensor_shards_are_refused_by_the_cli(capsys):
  """The operands split over the shards take their amax across shards in XLA; "pallas" would have to refuse them
  mid-trace, so the CLI says so first (and points to "auto")."""
  with pytest.raises(SystemExit):
    train.main(
      [
        "--recipe",
        "nvfp4_rtn",
        "--deterministic",
        "2",
        "--tensor-shards",
        "2",
        "--quantizer-backend",
        "pallas",
        "--batch-size",
        "4",
        "--seq-len",
        "64",
        "--tokens",
        "256",
      ]
    )
  assert "with --tensor-shards the operands split over the shards are quantized by XLA" in capsys.readouterr().err


# slow tier; default representative: test_losses_and_trained_state_are_bit_identical_on_a_dp_fsdp_tp_mesh[bf16] (the
# microbatched step under shard_map)
@pytest.mark.slow
def test_one_device_steps_compile_once(corpus):
  """The microbatched step runs under shard_map on a 1x1 mesh; its state is placed there from the start, so the
  second and third steps (each fed the previous step's output) lower nothing: JAX reports no jaxpr-to-MLIR lowering
  while they run (a state placed differently from the first step's output would be lowered again)."""
  import jax

  config = train.TrainConfig(
    model="100K", data=corpus, recipe="bf16", batch_size=4, seq_len=64, tokens=768, deterministic=2
  )
  trainer = train.Trainer(config, model_overrides=OVERRIDES)
  state = trainer.init_state()
  state, _ = trainer.train_step(state, trainer.place(trainer.stream.batch(0)), trainer.quant_key(0))
  lowered = []

  def listen(event, duration, **kwargs):
    del duration
    if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
      lowered.append(kwargs.get("fun_name", "?"))

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    for step in (1, 2):
      state, _ = trainer.train_step(state, trainer.place(trainer.stream.batch(step)), trainer.quant_key(step))
    jax.block_until_ready(state)
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  assert lowered == []
