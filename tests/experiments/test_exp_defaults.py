"""The experiments model's execution defaults: cuDNN flash attention on a GPU (XLA's elsewhere and under
``--deterministic``), the fused quantizers where they run (``quantizer_backend="auto"``; XLA's on a mesh without
``--deterministic``), and errors naming the field for what cannot run."""

import dataclasses

import jax.numpy as jnp
import pytest

from fp4jax_experiments import model as model_lib
from fp4jax_experiments import sharding, train

TINY = {"n_layers": 1, "d_model": 64, "n_heads": 2, "ffn_hidden": 64}


@pytest.mark.parametrize(
  "impl,dtype,platform,want",
  [
    ("auto", jnp.bfloat16, "gpu", "cudnn"),
    (None, jnp.bfloat16, "gpu", "cudnn"),
    ("auto", jnp.float16, "gpu", "cudnn"),
    ("auto", jnp.float32, "gpu", "xla"),  # cuDNN's flash attention takes 16-bit inputs only
    ("auto", jnp.bfloat16, "cpu", "xla"),
    ("auto", jnp.bfloat16, "tpu", "xla"),
    ("xla", jnp.bfloat16, "gpu", "xla"),
    ("cudnn", jnp.bfloat16, "cpu", "cudnn"),  # explicit: taken as asked (jax raises on a CPU)
  ],
)
def test_attention_implementation_per_platform_and_dtype(impl, dtype, platform, want):
  config = model_lib.model_config("100K", attention_impl=impl, dtype=dtype)
  assert model_lib.attention_implementation(config, platform) == want


def test_defaults_are_the_fast_paths():
  config = model_lib.model_config("100K")
  assert (config.attention_impl, config.quantizer_backend) == ("auto", "auto")
  assert model_lib.attention_implementation(config) == "xla"  # this CPU


def test_unknown_attention_impl_names_the_field():
  with pytest.raises(ValueError, match=r"attention_impl must be one of \(None, 'auto', 'xla', 'cudnn'\), got 'flash'"):
    model_lib.model_config("100K", attention_impl="flash")


def _trainer(corpus, layout=None, overrides=None, **config):
  config = train.TrainConfig(model="100K", data=corpus, batch_size=4, seq_len=16, tokens=64, **config)
  return train.Trainer(config, layout=layout, model_overrides={**TINY, **(overrides or {})})


def test_deterministic_runs_take_xla_attention_unless_asked(corpus):
  assert _trainer(corpus, deterministic=2).model_config.attention_impl == "xla"
  assert _trainer(corpus, deterministic=2, attention_impl="auto").model_config.attention_impl == "auto"
  assert _trainer(corpus).model_config.attention_impl == "auto"


FP4, BF16, MOE = ("100K", "nvidia_nvfp4"), ("100K", "bf16"), ("1M-moe", "nvidia_nvfp4")


@pytest.mark.parametrize(
  "model,backend,layout,deterministic,comm,want",
  [
    (FP4, "auto", None, 0, "float32", "auto"),
    (FP4, "auto", sharding.Layout(data=1), 0, "float32", "auto"),
    # a data-parallel mesh: shard_map data parallelism, every token shard quantized by the kernels
    (FP4, "auto", sharding.Layout(data=2), 0, "float32", "auto"),
    (FP4, "pallas", sharding.Layout(data=2), 0, "float32", "pallas"),
    (FP4, "auto", sharding.Layout(data=2, fsdp=True), 0, "float32", "auto"),
    (FP4, "auto", sharding.Layout(data=2), 0, "bfloat16", "auto"),
    (FP4, "pallas", sharding.Layout(data=2), 0, "bfloat16", "pallas"),
    # a model axis, alone or with a data axis: the Megatron shards under shard_map, the kernels on the slices they
    # take (beside a data axis, token-sharded too)
    (FP4, "auto", sharding.Layout(model=2), 0, "float32", "auto"),
    (FP4, "auto", sharding.Layout(data=2, model=2), 0, "float32", "auto"),
    (FP4, "auto", sharding.Layout(data=2, model=2, fsdp=True), 0, "float32", "auto"),
    # XLA's partitioner: MoE experts
    (MOE, "auto", sharding.Layout(data=2), 0, "float32", "xla"),
    (MOE, "auto", sharding.Layout(data=2, model=2), 0, "float32", "xla"),
    # deterministic: each device quantizes whole microbatches
    (FP4, "auto", sharding.Layout(model=2), 2, "float32", "auto"),
    (FP4, "pallas", sharding.Layout(data=2), 2, "float32", "pallas"),
    (FP4, "xla", sharding.Layout(data=2), 0, "float32", "xla"),
    (FP4, "pallas", None, 0, "float32", "pallas"),
    (BF16, "pallas", sharding.Layout(model=2), 0, "float32", "pallas"),  # nothing to quantize
  ],
)
def test_quantizer_backend_on_a_mesh(model, backend, layout, deterministic, comm, want):
  size, recipe = model
  config = train.TrainConfig(
    model=size, recipe=recipe, batch_size=4, seq_len=16, tokens=64, deterministic=deterministic, grad_comm_dtype=comm
  )
  shape = model_lib.model_config(size, recipe=recipe)
  assert train.quantizer_backend_for(backend, layout, config, shape) == want


@pytest.mark.parametrize("backend", ["pallas", "native"])
@pytest.mark.parametrize("layout", [sharding.Layout(model=2), sharding.Layout(data=2, model=2)])
def test_kernel_quantizers_on_a_model_axis_without_deterministic_are_refused(backend, layout):
  """(MoE models refuse the kernels on any layout: ``model.ModelConfig``'s own check.)"""
  config = train.TrainConfig(model="100K", recipe="nvidia_nvfp4", batch_size=4, seq_len=16, tokens=64)
  shape = model_lib.model_config("100K", recipe="nvidia_nvfp4")
  refusal = rf"quantizer_backend='{backend}' trains on one device.*mesh {layout.describe()}"
  with pytest.raises(ValueError, match=refusal):
    train.quantizer_backend_for(backend, layout, config, shape)


@pytest.mark.parametrize(
  "model,backend,layout,comm,want",
  [
    (FP4, "auto", sharding.Layout(data=2), "float32", True),
    (FP4, "auto", sharding.Layout(data=2, fsdp=True), "float32", True),
    (FP4, "xla", sharding.Layout(data=2), "float32", False),
    (FP4, "xla", sharding.Layout(data=2), "bfloat16", True),  # the wire dtype needs shard_map
    (BF16, "auto", sharding.Layout(data=2), "float32", False),
    (BF16, "auto", sharding.Layout(data=2), "bfloat16", True),
    (MOE, "auto", sharding.Layout(data=2), "float32", False),
    (FP4, "auto", sharding.Layout(model=2), "float32", False),
    (FP4, "auto", sharding.Layout(data=1), "float32", False),
    (FP4, "auto", None, "float32", False),
  ],
)
def test_which_steps_run_data_parallel_under_shard_map(model, backend, layout, comm, want):
  size, recipe = model
  config = train.TrainConfig(model=size, recipe=recipe, batch_size=4, seq_len=16, tokens=64, grad_comm_dtype=comm)
  shape = model_lib.model_config(size, recipe=recipe, quantizer_backend=backend)
  assert train.token_sharded_data_parallel(layout, config, shape) is want


@pytest.mark.parametrize(
  "layout,comm,grad_sum,want",
  [
    (sharding.Layout(data=2), "float32", "per_block", ("blocks",)),
    (sharding.Layout(data=2), "bfloat16", "per_block", ("blocks",)),
    (sharding.Layout(data=2), "float8_e4m3fn", "per_block", ()),  # a per-tensor scale: one sum per stacked tensor
    (sharding.Layout(data=2, fsdp=True), "float32", "per_block", ()),  # reduce-scattered after the backward
    (sharding.Layout(data=2), "float32", "after_backward", ()),
  ],
)
def test_which_data_parallel_steps_sum_gradients_per_block(layout, comm, grad_sum, want):
  config = train.TrainConfig(
    model="100K", recipe="nvidia_nvfp4", batch_size=4, seq_len=16, tokens=64, grad_comm_dtype=comm
  )
  shape = model_lib.model_config("100K", recipe="nvidia_nvfp4", grad_sum=grad_sum)
  assert train.per_block_grad_sums(layout, config, shape) == want
  if grad_sum == "per_block":  # a BF16 first block: its own stack, summed per block too
    two = dataclasses.replace(shape, bf16_first=1)
    assert train.per_block_grad_sums(layout, config, two) == (("first_blocks", "blocks") if want else ())


def test_grad_sum_must_be_a_known_mode():
  with pytest.raises(ValueError, match=r"grad_sum must be one of \('per_block', 'after_backward'\), got 'end'"):
    model_lib.model_config("100K", grad_sum="end")


@pytest.mark.parametrize(
  "model,backend,layout,deterministic,want",
  [
    (FP4, "auto", sharding.Layout(model=2), 0, True),
    (FP4, "pallas", sharding.Layout(model=2), 0, True),  # (quantizer_backend_for refuses it first)
    (FP4, "xla", sharding.Layout(model=2), 0, False),
    (FP4, "auto", sharding.Layout(data=2, model=2), 0, True),  # token-sharded too
    (FP4, "auto", sharding.Layout(data=2, model=2, fsdp=True), 0, True),
    (MOE, "auto", sharding.Layout(data=2, model=2), 0, False),
    (FP4, "auto", sharding.Layout(model=2), 2, False),  # --deterministic: its own shard_map step
    (BF16, "auto", sharding.Layout(model=2), 0, False),
    (FP4, "auto", sharding.Layout(data=2), 0, False),
    (FP4, "auto", None, 0, False),
  ],
)
def test_which_steps_run_tensor_parallel_shards(model, backend, layout, deterministic, want):
  size, recipe = model
  config = train.TrainConfig(
    model=size, recipe=recipe, batch_size=4, seq_len=16, tokens=64, deterministic=deterministic
  )
  shape = model_lib.model_config(size, recipe=recipe, quantizer_backend=backend)
  assert train.tensor_parallel_shards(layout, config, shape) is want


def test_model_config_is_frozen_with_the_new_fields():
  config = model_lib.model_config("100K")
  with pytest.raises(dataclasses.FrozenInstanceError):
    config.attention_impl = "xla"
