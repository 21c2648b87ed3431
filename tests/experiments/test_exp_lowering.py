"""experiments.lowering and the Trainer's steps lowered under ModelConfig.jax_config: a GPU lowering (done here on
the CPU, ``lowering_platforms=("cuda",)``) draws JAX's threefry as one custom call per call under
``jax_threefry_gpu_kernel_lowering``, as its 20 unrolled rounds (an xor each) without it."""

import copy

import jax
import pytest

import fp4jax.backends
from fp4jax_experiments import lowering, train

FLAG = "jax_threefry_gpu_kernel_lowering"
KERNEL = "custom_call @cu_threefry2x32"


def cuda_text(traced) -> str:
  return traced.lower(lowering_platforms=("cuda",)).as_text()


def bits(key):
  return jax.random.bits(key, (4,))


def test_scoped_sets_the_options_for_the_block_and_restores_them_even_after_an_error():
  key = jax.random.key(0)
  rounds = cuda_text(jax.jit(bits).trace(key))
  assert KERNEL not in rounds and rounds.count("stablehlo.xor") >= 20
  with pytest.raises(RuntimeError, match="inside"):
    with lowering.scoped({FLAG: True}):
      assert getattr(jax.config, FLAG)
      kernel = cuda_text(jax.jit(bits).trace(key))
      raise RuntimeError("inside")
  assert KERNEL in kernel and kernel.count("stablehlo.xor") < 20
  assert not getattr(jax.config, FLAG)


def test_scoped_refuses_an_unknown_option_before_setting_any():
  with pytest.raises(ValueError, match="'jax_bogus' is not a JAX config option"):
    with lowering.scoped({FLAG: True, "jax_bogus": 1}):
      pass
  assert not getattr(jax.config, FLAG)


def test_a_scoped_function_is_called_traced_and_lowered_under_its_options():
  seen = []

  def f(key):
    seen.append(getattr(jax.config, FLAG))  # at trace time
    return bits(key)

  step = lowering.Scoped(jax.jit(f), {FLAG: True})
  key = jax.random.key(1)
  assert (step(key) == bits(key)).all()  # the same bits
  assert KERNEL in cuda_text(step.trace(key))  # the traced program lowers under the option too
  assert seen and all(seen) and not getattr(jax.config, FLAG)
  assert step.__wrapped__ is f  # other attributes are the jitted function's
  assert copy.copy(step).flags == {FLAG: True}


@pytest.mark.parametrize(
  "recipe, threefry_kernel, kernels",
  [("nvidia_nvfp4", "auto", True), ("nvidia_nvfp4", False, False), ("ms_fp4", "auto", False)],
)
def test_the_trainers_steps_lower_threefry_as_their_model_config_says(recipe, threefry_kernel, kernels, monkeypatch):
  """Where the GPU kernels quantize (emulated: the unroll policy asks fp4jax.backends), nvidia_nvfp4's stack is
  unrolled by default: its steps' threefry calls are kernels on a GPU; ms_fp4 runs its blocks in a loop: their
  rounds."""
  monkeypatch.setattr(fp4jax.backends, "has_pallas_triton", lambda device=None: True)
  config = train.TrainConfig(model="100K", recipe=recipe, data="stdlib", batch_size=1, seq_len=16, tokens=16 * 4)
  trainer = train.Trainer(config, model_overrides={"n_layers": 2, "threefry_kernel": threefry_kernel})
  params = jax.eval_shape(trainer.init_state)["params"]
  inputs = (trainer.place(trainer.stream.batch(0)), trainer.quant_key(0))
  assert (KERNEL in cuda_text(trainer.eval_loss.trace(params, *inputs))) == kernels
  if threefry_kernel == "auto":
    assert (KERNEL in cuda_text(trainer.train_step.trace(trainer.init_state(), *inputs))) == kernels
