"""benchmarks/loop_copies.py: the census of a layer loop's value moves, against a hand-written HLO module whose
moves are known, a compiled scan, and the command on the CPU."""

import gzip
import json

import jax
import jax.numpy as jnp
import pytest

from benchmarks import loop_copies, report

# A while loop of 12 iterations whose body makes each kind of move once, beside what is not a move: a scalar copy,
# a slot write fused with arithmetic, and an ordinary fusion.
HLO = """HloModule m

%write_only (p0: bf16[12,16384,768], p1: s32[], p2: bf16[16384,768]) -> bf16[12,16384,768] {
  %p0 = bf16[12,16384,768]{2,1,0} parameter(0)
  %p2 = bf16[16384,768]{1,0} parameter(2)
  %b = bf16[1,16384,768]{2,1,0} bitcast(%p2)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %dus = bf16[12,16384,768]{2,1,0} dynamic-update-slice(%p0, %b, %p1, %z, %z)
}

%write_with_math (p0: f32[12,64], p1: s32[], p2: f32[64]) -> f32[12,64] {
  %p0 = f32[12,64]{1,0} parameter(0)
  %p2 = f32[64]{0} parameter(2)
  %e = f32[64]{0} exponential(%p2)
  %b = f32[1,64]{1,0} bitcast(%e)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %dus = f32[12,64]{1,0} dynamic-update-slice(%p0, %b, %p1, %z)
}

%read_only (p0: u8[12,16384,384], p1: s32[]) -> u8[16384,384] {
  %p0 = u8[12,16384,384]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %one = s32[] constant(1)
  %i = s32[] subtract(%p1, %one)
  %z = s32[] constant(0)
  %ds = u8[1,16384,384]{2,1,0} dynamic-slice(%p0, %i, %z, %z), dynamic_slice_sizes={1,16384,384}
  ROOT %b = u8[16384,384]{1,0} bitcast(%ds)
}

%in_place (p0: f32[12,8,8]) -> f32[8,8] {
  %p0 = f32[12,8,8]{2,1,0} parameter(0)
  ROOT %cc = f32[8,8]{1,0} custom-call(%p0), custom_call_target="x"
}

%add_one (p0: f32[64]) -> f32[64] {
  %p0 = f32[64]{0} parameter(0)
  %c = f32[] constant(1)
  %bc = f32[64]{0} broadcast(%c), dimensions={}
  ROOT %a = f32[64]{0} add(%p0, %bc)
}

%body (t: (s32[], bf16[16384,768])) -> (s32[], bf16[16384,768]) {
  %t = (s32[], bf16[16384,768]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = bf16[16384,768]{1,0} get-tuple-element(%t), index=1
  %c1 = bf16[16384,768]{1,0} copy(%x), metadata={op_name="jit(s)/fwd/copy"}
  %c2 = s32[] copy(%i)
  %w = bf16[12,16384,768]{2,1,0} fusion(%x, %i, %x), kind=kLoop, calls=%write_only, metadata={op_name="jit(s)/fwd/dus"}
  %m = f32[12,64]{1,0} fusion(%x, %i, %x), kind=kLoop, calls=%write_with_math
  %r = u8[16384,384]{1,0} fusion(%x, %i), kind=kLoop, calls=%read_only, metadata={op_name="jit(s)/bwd/ds"}
  %p = f32[8,8]{1,0} fusion(%x), kind=kCustom, calls=%in_place, backend_config={"name":"dynamic_address_computation"}
  %o = f32[64]{0} fusion(%x), kind=kLoop, calls=%add_one
  %k = (u8[16384,384]{1,0}, f32[1024]{0}) custom-call(%x), custom_call_target="__gpu$xla.gpu.triton", @CONFIG@
  %g = bf16[64,64]{1,0} custom-call(%x, %x), custom_call_target="__cublas$gemm"
  ROOT %out = (s32[], bf16[16384,768]{1,0}) tuple(%i, %c1)
}

%cond (t: (s32[], bf16[16384,768])) -> pred[] {
  %t = (s32[], bf16[16384,768]{1,0}) parameter(0)
  ROOT %p = pred[] constant(true)
}

ENTRY %main (a: (s32[], bf16[16384,768])) -> (s32[], bf16[16384,768]) {
  %a = (s32[], bf16[16384,768]{1,0}) parameter(0)
  @WHILE@
}
"""
HLO = HLO.replace("@CONFIG@", 'backend_config={name = "fp4_quantize_pair", num_warps = 4 : i32}')
HLO = HLO.replace(  # one line in HLO text: the census reads an instruction from its line
  "@WHILE@",
  "ROOT %loop = (s32[], bf16[16384,768]{1,0}) while(%a), condition=%cond, body=%body, "
  'metadata={op_name="jit(s)/w"}, backend_config={"known_trip_count":{"n":"12"}}',
)


def test_census_counts_each_kind_of_move_and_nothing_else():
  (loop,) = loop_copies.census(HLO)
  assert (loop["body"], loop["op_name"], loop["trip_count"]) == ("body", "w", 12)
  activation = 16384 * 768 * 2  # one bf16 slot of the stacked buffer, hand-computed
  assert loop["per_iteration"] == {
    "copy": [1, activation],
    "write": [1, activation],
    "read": [1, 16384 * 384],
    "in place": [1, 8 * 8 * 4],
  }
  by_kind = {g["kind"]: g for g in loop["groups"]}
  assert by_kind["read"]["op_name"] == "bwd/ds"
  assert by_kind["write"]["shape"] == "bf16[12,16384,768]" and by_kind["copy"]["op_name"] == "fwd/copy"
  assert [g["kind"] for g in loop["groups"]] == ["copy", "write", "read", "in place"]  # most bytes first, then kind
  assert loop["custom_calls"] == {"__cublas$gemm": 1, "fp4_quantize_pair": 1}
  # kernel launches: five fusions, two custom calls (one with a tuple shape), the activation's copy, not the scalar's
  kernels = {(k["opcode"], k["op"]): k["count"] for k in loop["kernels"]}
  assert kernels == {
    ("fusion", ""): 3,
    ("fusion", "fwd/dus"): 1,
    ("fusion", "bwd/ds"): 1,
    ("custom-call", ""): 2,
    ("copy", "fwd/copy"): 1,
  }
  assert loop["kernels"][0] == {"opcode": "fusion", "op": "", "count": 3}  # most first


@pytest.mark.parametrize(
  ("op_name", "source"),
  [
    (
      "transpose(jvp(Llama))/while/body/eval_jaxpr/blocks/attn/q/DotGeneral_0/jit(quantize_pair)/xor",
      "<dot>/jit(quantize_pair)/xor",
    ),
    ("jvp(Llama)/while/body/blocks/mlp/down/DotGeneral_12/reduce_max", "<dot>/reduce_max"),
    ("jvp(Llama)/while/body/blocks/attn_norm/rsqrt", "blocks/attn_norm/rsqrt"),
    ("blocks/mlp/gate/DotGeneral_3", "<dot>"),
    ("fwd/copy", "fwd/copy"),
  ],
)
def test_op_source_names_every_projection_s_op_alike(op_name, source):
  assert loop_copies.op_source(op_name) == source


# XLA:GPU outlines runs of a loop body into calls (its command buffers): a copy and a slot write one call away, a copy
# in an async computation, a custom call left in the body.
OUTLINED = (
  HLO[: HLO.index("%body (")]
  + """%command_buffer (x: bf16[16384,768], i: s32[]) -> bf16[12,16384,768] {
  %x = bf16[16384,768]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %c1 = bf16[16384,768]{1,0} copy(%x), metadata={op_name="jit(s)/fwd/copy"}
  ROOT %w = bf16[12,16384,768]{2,1,0} fusion(%c1, %i, %c1), kind=kLoop, calls=%write_only
}

%async_part (y: bf16[16384,768]) -> bf16[16384,768] {
  %y = bf16[16384,768]{1,0} parameter(0)
  ROOT %c3 = bf16[16384,768]{1,0} copy(%y), metadata={op_name="jit(s)/async/copy"}
}

%body (t: (s32[], bf16[16384,768])) -> (s32[], bf16[16384,768]) {
  %t = (s32[], bf16[16384,768]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = bf16[16384,768]{1,0} get-tuple-element(%t), index=1
  %cb = bf16[12,16384,768]{2,1,0} call(%x, %i), to_apply=%command_buffer
  %s = ((bf16[16384,768]{1,0}), bf16[16384,768]{1,0}) async-start(%x), calls=%async_part
  %g = bf16[64,64]{1,0} custom-call(%x, %x), custom_call_target="__cublas$gemm"
  ROOT %out = (s32[], bf16[16384,768]{1,0}) tuple(%i, %x)
}

"""
  + HLO[HLO.index("%cond (") :]
)


def test_census_enters_the_computations_a_body_calls():
  (loop,) = loop_copies.census(OUTLINED)
  activation = 16384 * 768 * 2
  assert loop["per_iteration"] == {
    "copy": [2, 2 * activation],
    "write": [1, activation],
    "read": [0, 0.0],
    "in place": [0, 0.0],
  }
  assert {g["op_name"] for g in loop["groups"] if g["kind"] == "copy"} == {"fwd/copy", "async/copy"}
  assert loop["custom_calls"] == {"__cublas$gemm": 1}


@pytest.mark.parametrize(
  ("shape", "size"), [("bf16[16384,768]", 16384 * 768 * 2), ("f4e2m1fn[4,6]", 12), ("pred[3]", 3), ("f32[]", 4)]
)
def test_shape_bytes(shape, size):
  assert loop_copies.shape_bytes(shape) == size


def test_a_compiled_scan_has_a_forward_and_a_backward_loop_of_its_length():
  def loss(w, x):
    h, _ = jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)
    return h.sum()

  hlo = jax.jit(jax.grad(loss)).lower(jnp.ones((4, 64, 64)), jnp.ones((32, 64))).compile().as_text()
  loops = loop_copies.census(hlo)
  assert [loop["trip_count"] for loop in loops] == [4, 4]
  for loop in loops:
    for g in loop["groups"]:
      whole = loop_copies.shape_bytes(g["shape"])
      assert g["bytes"] == (whole / int(g["shape"].split("[")[1].split(",")[0]) if g["kind"] == "write" else whole)


def test_command_writes_its_document_and_the_report_renders_it(tmp_path):
  out = tmp_path / "c.json"
  args = ["--model", "100K", "--recipe", "bf16", "--overrides", '{"scan_unroll": 1}']  # bf16 blocks in a loop
  args += ["--batch", "2", "--seq-len", "32", "--commit", "abc1234"]
  hlo = tmp_path / "hlo.txt.gz"
  assert loop_copies.main([*args, "--top", "3", "--out", str(out), "--hlo-out", str(hlo)]) == 0
  with gzip.open(hlo, "rt") as f:
    assert f.read().startswith("HloModule ")  # the compiled module the census read
  doc = json.loads(out.read_text())
  assert (doc["benchmark"], doc["commit"], doc["settings"]["recipe"]) == ("loop_copies", "abc1234", "bf16")
  assert doc["loops"] and all(len(loop["groups"]) <= 3 for loop in doc["loops"])
  section = "\n".join(report.RENDER["loop_copies"](doc))
  assert "python benchmarks/loop_copies.py --model 100K" in section and "| loop |" in section
  assert "Custom calls per iteration of " in section
  with pytest.raises(SystemExit):
    loop_copies.main([*args, "--top", "0", "--out", str(out)])
