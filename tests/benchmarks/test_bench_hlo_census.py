"""benchmarks/hlo_census.py: operations counted with every call inlined, threefry calls by caller (a module written
by hand, then one lowered by JAX for CUDA on this CPU), and the XLA quantizers and Triton kernels of a train step
as the backend dispatch decides them."""

import json

import jax
import pytest

import fp4jax.backends
from benchmarks import hlo_census
from fp4jax._src import backends

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


@pytest.fixture
def as_gpu(monkeypatch):
  """The kernels' dispatch answering as on a Hopper GPU (traced and lowered only, never run)."""
  monkeypatch.setattr(backends, "compute_capability", lambda device=None: (9, 0))
  monkeypatch.setattr(backends, "has_pallas_triton", lambda device=None: True)
  monkeypatch.setattr(backends, "pallas_interpret", lambda device=None: False)
  monkeypatch.setattr(fp4jax.backends, "has_pallas_triton", backends.has_pallas_triton)


def test_a_steps_quantizers_are_counted_where_the_backend_sends_them(as_gpu, tmp_path):
  """nvidia_nvfp4's 100K step at 2 x 64 tokens: every operand below the kernels' size threshold. Under "xla" every
  quantization is XLA code and no Triton kernel is called; under "pallas" none is XLA code; under "auto" the
  activations are XLA's and the prequantized weights the kernels' (at any size)."""
  row = lambda backend: hlo_census.measure("100K", "nvidia_nvfp4", {"quantizer_backend": backend}, 2, 64)
  xla, pallas, auto = row("xla"), row("pallas"), row("auto")
  assert xla["xla_quantizers"] > 0 and xla["triton_calls"] == 0
  assert pallas["xla_quantizers"] == 0 and pallas["triton_calls"] > 0
  assert 0 < auto["xla_quantizers"] < xla["xla_quantizers"] and 0 < auto["triton_calls"] < pallas["triton_calls"]
  for r in (xla, pallas, auto):
    assert r["threefry_calls"] == sum(r["threefry_by_caller"].values()) > 0 and 0 < r["threefry_share"] < 1


def test_the_command_writes_one_row_per_recipe_and_variant(as_gpu, tmp_path):
  out = tmp_path / "census.json"
  variants = json.dumps({"loop": {"scan_unroll": 1}, "unrolled": {"scan_unroll": 2}})
  argv = ["--model", "100K", "--recipes", "bf16,nvfp4_rtn", "--variants", variants, "--batch", "2", "--seq-len", "64"]
  hlo_census.main([*argv, "--commit", "abc", "--out", str(out)])
  doc = json.loads(out.read_text())
  assert doc["benchmark"] == "hlo_census" and doc["commit"] == "abc" and doc["command"].startswith("python benchmarks/")
  assert [(r["recipe"], r["variant"]) for r in doc["rows"]] == [
    ("bf16", "loop"),
    ("bf16", "unrolled"),
    ("nvfp4_rtn", "loop"),
    ("nvfp4_rtn", "unrolled"),
  ]
  bf16 = doc["rows"][0]
  assert bf16["xla_quantizers"] == bf16["triton_calls"] == 0  # BF16 quantizes nothing
  loop, unrolled = doc["rows"][2:]
  assert unrolled["inlined_ops"] > loop["inlined_ops"]  # two blocks' code against one loop body


@pytest.mark.parametrize(
  "argv, message",
  [
    (["--batch", "0"], "--batch must be >= 1, got 0"),
    (["--seq-len", "-4"], "--seq-len must be >= 1, got -4"),
    (["--variants", '{"loop": 1}'], "--variants must map labels to JSON objects"),
    (["--variants", "[1]"], "--variants must map labels to JSON objects"),
  ],
)
def test_bad_arguments_are_refused_naming_the_option(argv, message, capsys):
  with pytest.raises(SystemExit):
    hlo_census.main(argv)
  assert message in capsys.readouterr().err
