"""Mixture-of-experts sizes of the experiments' model: config validation, parameter counts, the scanned MoE stacks,
sharding rules and layout refusals, and training under FP4 recipes."""

import dataclasses
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from fp4jax_experiments import model as m
from fp4jax_experiments import optimizer, sharding, train

# One tiny MoE block: d_model and expert_hidden 128, the smallest where quartet2's 128-point rotation applies.
TINY = {"n_layers": 1, "d_model": 128, "n_heads": 1, "num_experts": 4, "top_k": 2, "expert_hidden": 128}


def _leaf_count(tree) -> int:
  return sum(x.size for x in jax.tree.leaves(tree))


@pytest.fixture(autouse=True)
def _float32_matmuls():
  """A GPU runs float32 matmuls as TF32 by default; these tests compare float32 models with float64 NumPy."""
  with jax.default_matmul_precision("highest"):
    yield


def test_moe_sizes_and_counts_by_hand():
  """1M-moe: 4 blocks of d 128, 4 experts of width 128, top 2. Per block: attention 4·128² = 65536, norms 256,
  router 128·4 = 512, experts 4·3·128·128 = 196608 (of which a token uses 2·3·128·128 = 98304); final norm 128."""
  counts = m.parameter_count(m.model_config("1M-moe"))
  assert counts["non_embedding"] == 4 * (65536 + 256 + 512 + 196608) + 128 == 1_051_776
  assert counts["active_non_embedding"] == 4 * (65536 + 256 + 512 + 98304) + 128 == 658_560
  assert counts["total"] == 1_051_776 + 2 * 256 * 128
  dense = m.parameter_count(m.model_config("1M"))
  assert dense["active_non_embedding"] == dense["non_embedding"]  # the dense model's count is unchanged
  assert m.model_config("10M-moe").num_experts == 8 and m.model_config("1M").num_experts == 0


@pytest.mark.parametrize(
  "size,overrides",
  [("1M-moe", {}), ("10M-moe", {}), ("1M-moe", {"expert_hidden": 0, "ffn_hidden": 192, "top_k": 1})],
)
def test_moe_parameter_count_matches_initialized_model(size, overrides):
  config = m.model_config(size, **overrides)
  shapes = jax.eval_shape(lambda k: m.init_params(config, k), jax.random.key(0))
  assert _leaf_count(shapes) == m.parameter_count(config)["total"]
  mlp = shapes["blocks"]["mlp"]
  e, h, d, layers = config.num_experts, config.moe_hidden, config.d_model, config.n_layers
  assert (mlp["w_in"].shape, mlp["w_out"].shape) == ((layers, e, d, 2 * h), (layers, e, h, d))
  assert mlp["router"]["kernel"].shape == (layers, d, e)


@pytest.mark.parametrize(
  "field,changes",
  [
    ("num_experts", {"num_experts": -1}),
    ("expert_hidden", {"expert_hidden": -4}),
    ("expert_hidden", {"num_experts": 0, "expert_hidden": 64}),
    ("top_k", {"top_k": 5}),
    ("top_k", {"top_k": 0}),
    ("quantizer_backend", {"quantizer_backend": "pallas"}),
  ],
)
def test_bad_moe_config_names_the_field(field, changes):
  with pytest.raises(ValueError, match=field):
    m.model_config("1M-moe", **changes)


# slow tier; default representative: test_moe_parameter_count_matches_initialized_model (the same init's shapes)
@pytest.mark.slow
def test_moe_init_scales_and_per_layer_stacks():
  """w_in ~ N(0, 0.02²), w_out ~ N(0, (0.02/sqrt(2L))²): sample std within 6 standard errors (std/sqrt(2n))."""
  config = m.model_config("1M-moe")
  mlp = m.init_params(config, jax.random.key(0))["blocks"]["mlp"]
  for name, std in (("w_in", 0.02), ("w_out", 0.02 / np.sqrt(2 * config.n_layers))):
    values = np.asarray(mlp[name], np.float64)
    assert abs(values.std() - std) < 6 * std / np.sqrt(2 * values.size), (name, values.std(), std)
    assert not np.allclose(values[0], values[1])  # each layer its own draw


def _two_layer_moe():
  """A two-block fp32 MoE model (bf16 recipe), its parameters and a batch of tokens."""
  config = m.model_config("1M-moe", n_layers=2, d_model=64, n_heads=1, expert_hidden=64, vocab_size=64)
  config = dataclasses.replace(config, dtype=jnp.float32)
  params = jax.jit(m.init_params, static_argnums=0)(config, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 64)
  return config, params, tokens


def test_moe_scan_equals_blocks_one_by_one():
  """The scanned MoE stack runs layer i with parameter slice i (fp32, bf16 recipe: ``jax.lax.ragged_dot``)."""
  config, params, tokens = _two_layer_moe()

  def unrolled(params, tokens):
    h = nn.Embed(64, config.d_model, dtype=config.dtype).apply({"params": params["embed"]}, tokens)
    for i in range(config.n_layers):
      h, _ = m.Block(config, "bf16").apply({"params": jax.tree.map(lambda x: x[i], params["blocks"])}, h)
    h = nn.RMSNorm(config.norm_eps, dtype=config.dtype).apply({"params": params["final_norm"]}, h)
    return nn.Dense(64, use_bias=False, dtype=config.dtype).apply({"params": params["lm_head"]}, h)

  scanned = jax.jit(m.Llama(config).apply)({"params": params}, tokens)
  np.testing.assert_allclose(scanned, jax.jit(unrolled)(params, tokens), rtol=1e-5, atol=1e-6)


# slow tier; default representative: test_moe_layer_recipes_follow_the_bf16_policy (the stacks' recipes); the key
# split is nn.scan's, as in test_exp_model.py::test_fp4_model_keeps_first_and_last_blocks_in_bf16 (slow too)
@pytest.mark.slow
def test_moe_scan_splits_quant_per_layer():
  """Under an FP4 recipe each layer's MoE draws its own "quant" key (an FP4 MoE forward compile)."""
  config, params, tokens = _two_layer_moe()
  fp4 = dataclasses.replace(config, recipe="nvidia_nvfp4", dtype=jnp.bfloat16)

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, m.MoE) and context.method_name == "__call__":
      context.module.sow("intermediates", "key", jax.random.key_data(context.module.make_rng("quant")))
    return next_fun(*args, **kwargs)

  def forward(params, tokens, key):
    with nn.intercept_methods(record):
      return m.Llama(fp4).apply({"params": params}, tokens, rngs={"quant": key}, mutable=["intermediates"])

  _, state = jax.eval_shape(forward, params, tokens, jax.random.key(2))  # the keys' shapes: traced, not run
  assert state["intermediates"]["blocks"]["mlp"]["key"][0].shape[0] == 2
  _, state = jax.jit(forward)(params, tokens, jax.random.key(2))
  keys = np.asarray(state["intermediates"]["blocks"]["mlp"]["key"][0])
  assert not np.array_equal(keys[0], keys[1])


def test_moe_layer_recipes_follow_the_bf16_policy():
  config = m.model_config("1M-moe", n_layers=3, d_model=64, n_heads=1, recipe="nvidia_nvfp4", bf16_first=1)
  seen = {}

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, m.MoE) and context.method_name == "__call__":
      seen[context.module.scope.path[0]] = context.module.recipe
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    jax.eval_shape(
      lambda k: m.Llama(config).init({"params": k, "quant": k}, jnp.zeros((1, 16), jnp.int32)), jax.random.key(0)
    )
  assert seen == {"first_blocks": "bf16", "blocks": "nvidia_nvfp4"}


def test_moe_refuses_tensor_parallelism():
  config = m.model_config("1M-moe", **TINY)
  tp = m.TensorParallel("model", 2)
  with pytest.raises(ValueError, match="num_experts=4: tensor parallelism"):
    jax.eval_shape(lambda k: m.Llama(config, tp).init({"params": k}, jnp.zeros((1, 8), jnp.int32)), jax.random.key(0))
  with pytest.raises(ValueError, match="num_experts=4: a model axis"):
    sharding.check_layout(sharding.Layout(data=2, model=2), config, batch_size=8, seq_len=64)
  with pytest.raises(ValueError, match="num_experts=4 with recipe 'nvidia_nvfp4'"):
    sharding.token_sharded_model(m.Llama(dataclasses.replace(config, recipe="nvidia_nvfp4")))
  # data parallelism and FSDP pass; ffn_hidden (unused by the experts) is not checked
  sharding.check_layout(sharding.Layout(data=4, fsdp=True), dataclasses.replace(config, ffn_hidden=66), 8, 64)


def test_moe_partition_specs():
  config = m.model_config("1M-moe", **TINY)
  params = jax.eval_shape(lambda k: m.init_params(config, k), jax.random.key(0))
  state = {"params": params, "opt_state": jax.eval_shape(optimizer.adamw(optimizer.lr_schedule(1e-3, 10)).init, params)}
  for layout, f in ((sharding.Layout(data=4), None), (sharding.Layout(data=4, fsdp=True), "data")):
    expected = {"kernel": P(None, f, None), "w_in": P(None, None, f, None), "w_out": P(None, None, None, f)}
    found = []

    def check(path, leaf):
      names = [str(getattr(k, "key", k)) for k in path]
      if "mlp" in names and leaf.ndim > 1:  # router (layers, d, E), w_in (layers, E, d, 2h), w_out (layers, E, h, d)
        found.append(names[-1])
        assert sharding.leaf_spec(path, leaf.shape, layout) == expected[names[-1]], names

    jax.tree_util.tree_map_with_path(check, state)
    assert sorted(found) == sorted(["kernel", "w_in", "w_out"] * 3)  # the parameters and AdamW's mu and nu


# slow tier; default representative: an integration run; its parts: test_moe_scan_equals_blocks_one_by_one, the
# Trainer's run in test_exp_train_trust.py, tests/flax/test_moe.py::test_linen_moe_equals_a_per_token_numpy_loop
@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["bf16", "nvidia_nvfp4", "quartet2"])
def test_moe_model_trains_under_recipe(corpus, recipe):
  """A one-block MoE model learns the byte corpus: the loss of its last steps falls well below the first's."""
  config = train.TrainConfig(
    model="1M-moe",
    recipe=recipe,
    tokens=12 * 8 * 32,
    data=corpus,
    batch_size=8,
    seq_len=32,
    lr=3e-3,
    log_every=1,
    eval_every=12,
    eval_batches=1,
    ckpt_every=12,
  )
  trainer = train.Trainer(config, model_overrides=TINY)
  assert trainer.model_config.num_experts == 4 and trainer.model_config.recipe == recipe
  state, losses = trainer.init_state(), []
  for step in range(config.steps):
    state, metrics = trainer.train_step(state, trainer.place(trainer.stream.batch(step)), trainer.quant_key(step))
    losses.append(float(metrics["loss"]))
  assert np.isfinite(losses).all(), losses
  assert np.mean(losses[-3:]) < 0.75 * np.mean(losses[:2]), losses


# slow tier; default representative: test_exp_deterministic.py's [bf16] case (data-parallel training, bit for bit)
@pytest.mark.slow
def test_moe_data_parallel_losses_match_one_device(corpus):
  """The MoE model on data=2 and data=2 FSDP meshes (2 CPU devices, in a subprocess: the device count is fixed
  before jax is imported) trains the one-device losses, up to the order of the sums over a sharded axis (the
  tolerance of test_exp_sharding's LOSS_ATOL)."""
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
  args = ["--checks", "loss", "--recipes", "bf16", "--meshes", "data=2", "data=2:fsdp", "--data", corpus]
  args += ["--model", "1M-moe", "--model-overrides", json.dumps(TINY), "--steps", "3", "--seq-len", "32"]
  proc = subprocess.run(
    [sys.executable, "-m", "fp4jax_experiments.layout_check", *args], env=env, capture_output=True, text=True
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  assert [r["mesh"] for r in records] == ["data=2", "data=2 fsdp"], records
  for r in records:
    losses, reference = np.float32(r["losses"]), np.float32(r["reference"])
    assert np.all(np.isfinite(losses)) and reference[-1] < reference[0], r
    np.testing.assert_allclose(losses, reference, rtol=0, atol=5e-3, err_msg=str(r))
