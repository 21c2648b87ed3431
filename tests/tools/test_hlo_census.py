"""tools/hlo_census.py: operations counted with every call inlined, threefry calls by caller (a module written by
hand, then one lowered by JAX for CUDA on this CPU)."""

import importlib.util
from pathlib import Path

import jax

TOOL = Path(__file__).resolve().parents[2] / "tools" / "hlo_census.py"
spec = importlib.util.spec_from_file_location("hlo_census", TOOL)
hlo_census = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hlo_census)

MODULE = """
module @m {
  func.func public @main(%a: tensor<f32>) -> tensor<f32> {
    %c = stablehlo.constant dense<1.0> : tensor<f32>
    %0 = stablehlo.add %a, %c : tensor<f32>
    %1 = call @f(%0) : (tensor<f32>) -> tensor<f32>
    %2 = call @f(%1) : (tensor<f32>) -> tensor<f32>
    %3 = stablehlo.custom_call @kernel(%2) : (tensor<f32>) -> tensor<f32>
    return %3 : tensor<f32>
  }
  func.func private @f(%a: tensor<f32>) -> tensor<f32> {
    %0 = stablehlo.multiply %a, %a : tensor<f32>
    %1:2 = call @threefry2x32_3(%0, %0) : (tensor<f32>, tensor<f32>) -> (tensor<f32>, tensor<f32>)
    return %1#0 : tensor<f32>
  }
  func.func private @threefry2x32_3(%a: tensor<f32>, %b: tensor<f32>) -> (tensor<f32>, tensor<f32>) {
    %0 = stablehlo.xor %a, %b : tensor<f32>
    %1 = stablehlo.add %0, %b : tensor<f32>
    %2 = stablehlo.shift_left %1, %b : tensor<f32>
    return %1, %2 : tensor<f32>, tensor<f32>
  }
}
"""


def test_calls_are_inlined_by_count_and_threefry_is_counted_by_caller():
  # main: add and the custom call (2), f twice: its multiply (1) and a threefry of 3 operations each
  result = hlo_census.census(MODULE)
  assert result["inlined_ops"] == 2 + 2 * (1 + 3)
  assert dict(result["threefry_calls"]) == {"f": 2} and result["threefry_ops"] == 6


def test_a_lowered_draw_is_one_threefry_call_and_its_kernel_lowering_a_custom_call():
  draw = jax.jit(lambda k: jax.random.bits(k, (4,))).trace(jax.random.key(0))
  rounds = hlo_census.census(draw.lower(lowering_platforms=("cuda",)).as_text())
  assert sum(rounds["threefry_calls"].values()) == 1 and rounds["threefry_ops"] > 100  # 20 rounds unrolled
  saved = jax.config.jax_threefry_gpu_kernel_lowering
  try:
    jax.config.update("jax_threefry_gpu_kernel_lowering", True)
    kernel = hlo_census.census(draw.lower(lowering_platforms=("cuda",)).as_text())
  finally:
    jax.config.update("jax_threefry_gpu_kernel_lowering", saved)
  assert sum(kernel["threefry_calls"].values()) == 1 and kernel["threefry_ops"] < 10
