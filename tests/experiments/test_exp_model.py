"""Model: parameter counts per size, shapes, causality, RoPE, per-layer recipe policy."""

import contextlib
import dataclasses
import io

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

import fp4jax
import fp4jax.backends
from fp4jax_experiments import model as m

QUARTET_SIZES = {"30M": 30e6, "50M": 50e6, "100M": 100e6, "200M": 200e6}
TINY_SIZES = {"100K": 1e5, "1M": 1e6, "3M": 3e6, "10M": 10e6, "1M-moe": 1e6, "10M-moe": 10e6}  # MoE: total counts


def _leaf_count(tree) -> int:
  return sum(x.size for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("size", list(m.SIZES))
def test_analytic_parameter_count_matches_initialized_model(size):
  config = m.model_config(size)
  shapes = jax.eval_shape(lambda k: m.init_params(config, k), jax.random.key(0))
  assert _leaf_count(shapes) == m.parameter_count(config)["total"]
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(shapes))


@pytest.mark.parametrize(
  "size,nominal,tolerance",
  [(s, n, 0.05) for s, n in QUARTET_SIZES.items()] + [(s, n, 0.20) for s, n in TINY_SIZES.items()],
)
def test_size_names_are_non_embedding_counts(size, nominal, tolerance):
  count = m.parameter_count(m.model_config(size))["non_embedding"]
  assert abs(count - nominal) / nominal < tolerance, count


def test_quartet_shapes_and_swiglu_width():
  config = m.model_config("30M")
  assert (config.n_layers, config.d_model, config.n_heads, config.head_dim) == (6, 640, 5, 128)
  assert config.ffn_hidden == 1792  # 256·ceil(8·640/3/256)
  assert m.SIZES["100M"].lr == 6e-4


def test_forward_shape_dtype_and_causality():
  config = m.model_config("100K", vocab_size=64, n_heads=2)  # two blocks of two heads
  params = jax.jit(m.init_params, static_argnums=0)(config, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 64)
  forward = jax.jit(m.Llama(config).apply)
  logits = forward({"params": params}, tokens)
  assert logits.shape == (2, 16, 64) and logits.dtype == jnp.float32
  changed = tokens.at[:, 10].set((tokens[:, 10] + 1) % 64)
  logits2 = forward({"params": params}, changed)
  np.testing.assert_array_equal(logits[:, :10], logits2[:, :10])
  assert not np.allclose(logits[:, 10:], logits2[:, 10:])


def test_rope_scores_depend_only_on_relative_position():
  q = jax.random.normal(jax.random.key(0), (1, 1, 1, 32))
  k = jax.random.normal(jax.random.key(1), (1, 1, 1, 32))
  seq = 12
  rq = m.apply_rope(jnp.broadcast_to(q, (1, seq, 1, 32)), 1e4)[0, :, 0]
  rk = m.apply_rope(jnp.broadcast_to(k, (1, seq, 1, 32)), 1e4)[0, :, 0]
  scores = rq @ rk.T
  np.testing.assert_allclose(scores[7, 4], scores[3, 0], rtol=1e-5)
  np.testing.assert_allclose(scores[11, 2], scores[9, 0], rtol=1e-5)
  np.testing.assert_allclose(jnp.linalg.norm(rq, axis=-1), jnp.linalg.norm(q), rtol=1e-5)
  assert not np.isclose(scores[7, 4], scores[7, 3])


def test_bf16_first_last_policy():
  config = m.model_config("3M", recipe="some_fp4", bf16_first=1, bf16_last=2)
  assert [config.layer_recipe(i) for i in range(4)] == ["bf16", "some_fp4", "bf16", "bf16"]
  assert m.projection_dot_cls("bf16") is None


@pytest.mark.parametrize("field,value", [("bf16_last", 7), ("n_heads", 3), ("recipe", ""), ("vocab_size", 0)])
def test_bad_config_names_the_argument(field, value):
  with pytest.raises(ValueError, match=field):
    m.model_config("1M", **{field: value})


def test_unknown_size_is_refused():
  with pytest.raises(ValueError, match="model size '7M'"):
    m.model_config("7M")


def test_layer_stacks_follow_the_bf16_policy():
  config = m.model_config("3M", recipe="some_fp4", bf16_first=1, bf16_last=2)
  assert m.layer_stacks(config) == (
    m.LayerStack("first_blocks", "bf16", 0, 1),
    m.LayerStack("blocks", "some_fp4", 1, 1),
    m.LayerStack("last_blocks", "bf16", 2, 2),
  )
  assert m.layer_stacks(m.model_config("3M")) == (m.LayerStack("blocks", "bf16", 0, 4),)
  stacks = m.layer_stacks(config)
  assert [s.recipe for s in stacks for _ in range(s.length)] == [config.layer_recipe(i) for i in range(4)]


def test_scanned_stacks_equal_blocks_applied_one_by_one():
  """The scan runs layer i of a stack with slice i of the stacked parameters, in order. In fp32: in bf16, XLA's
  fusions differ between the scanned and the unrolled program and move roundings by an ulp."""
  config = m.model_config("100K", n_layers=3, bf16_first=1, vocab_size=64, dtype=jnp.float32)
  params = jax.jit(m.init_params, static_argnums=0)(config, jax.random.key(0))
  assert params["blocks"]["attn"]["q"]["kernel"].shape == (2, 64, 64)
  assert params["first_blocks"]["mlp_norm"]["scale"].shape == (1, 64)
  assert not np.allclose(params["blocks"]["attn"]["q"]["kernel"][0], params["blocks"]["attn"]["q"]["kernel"][1])
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 64)

  def unrolled(params, tokens):
    h = nn.Embed(64, config.d_model, dtype=config.dtype).apply({"params": params["embed"]}, tokens)
    for stack in m.layer_stacks(config):
      for i in range(stack.length):
        layer = jax.tree.map(lambda x: x[i], params[stack.name])
        h, _ = m.Block(config, stack.recipe).apply({"params": layer}, h)
    h = nn.RMSNorm(config.norm_eps, dtype=config.dtype).apply({"params": params["final_norm"]}, h)
    return nn.Dense(64, use_bias=False, dtype=config.dtype).apply({"params": params["lm_head"]}, h)

  scanned = jax.jit(m.Llama(config).apply)({"params": params}, tokens)
  np.testing.assert_allclose(scanned, jax.jit(unrolled)(params, tokens), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("vocab", [64, m.ONE_HOT_MAX_VOCAB + 1])
def test_token_embedding_is_the_gather_with_an_fp32_gradient(vocab):
  """Forward: bit-equal to nn.Embed's gather (one-hot GEMM up to ONE_HOT_MAX_VOCAB, the gather above). Gradient:
  the per-row sum of the output cotangents; the one-hot path sums in fp32 and rounds once to bf16 (relative error
  <= 2^-8 per element, bf16 unit roundoff), the scatter-add sums in bf16."""
  config = m.model_config("100K", vocab_size=vocab)
  tokens = jax.random.randint(jax.random.key(1), (4, 32), 0, 8)  # few distinct rows: every row collides
  module = m.TokenEmbedding(config)
  params = module.init(jax.random.key(0), tokens)
  reference = nn.Embed(vocab, config.d_model, dtype=config.dtype)
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, reference.init(jax.random.key(0), tokens))
  got = jax.jit(module.apply)(params, tokens)
  assert got.dtype == config.dtype
  np.testing.assert_array_equal(got, reference.apply(params, tokens))
  cotangent = jax.random.normal(jax.random.key(2), got.shape, jnp.float32).astype(config.dtype)
  _, vjp = jax.vjp(lambda p: module.apply(p, tokens), params)
  grad = np.asarray(vjp(cotangent)[0]["params"]["embedding"])
  expected = np.zeros((vocab, config.d_model))
  np.add.at(expected, np.asarray(tokens).ravel(), np.asarray(cotangent, np.float64).reshape(-1, config.d_model))
  if vocab <= m.ONE_HOT_MAX_VOCAB:  # one bf16 rounding of an fp32 sum (2^-8), with room for the fp32 sum's own error
    np.testing.assert_allclose(grad, expected, rtol=2**-8 + 2**-16, atol=1e-6)
  else:  # 64 sequential bf16 additions per row
    np.testing.assert_allclose(grad, expected, rtol=0, atol=0.05 * np.abs(expected).max())


def _block_residuals(recompute: str, recipe: str = "bf16", grads: bool = True):
  """(saved residuals as "dtype[shape]" of one Block's forward, the block's output, its gradients or None without
  ``grads``) under ``recompute``: batch 2 x 16 tokens, d 64, SwiGLU width 128."""
  config = m.ModelConfig(n_layers=2, d_model=64, n_heads=2, ffn_hidden=128, recipe=recipe, recompute=recompute)
  block = m.Block(config, recipe)
  h = jax.random.normal(jax.random.key(0), (2, 16, 64)).astype(jnp.bfloat16)
  params = block.init({"params": jax.random.key(1), "quant": jax.random.key(2)}, h)
  f = lambda p, h: block.apply(p, h, rngs={"quant": jax.random.key(3)})[0].astype(jnp.float32).sum()
  text = io.StringIO()
  with contextlib.redirect_stdout(text):  # one line per residual: "f32[2,16,64] output of ..."
    print_saved_residuals(f, params, h)
  saved = [line.split(" ")[0] for line in text.getvalue().splitlines()]
  return saved, jax.jit(f)(params, h), jax.jit(jax.grad(f, argnums=(0, 1)))(params, h) if grads else None


def test_recompute_saves_only_the_bf16_inputs_of_the_norms_and_the_swiglu_product():
  """recompute="none" saves each RMSNorm's float32 intermediates (three (B, S, d) activations per norm, two norms)
  and the SiLU's three bf16 (B, S, h) ones; "norms" saves none of the float32 ones, "norms_swiglu" none of either.
  The forward is the same bits; the gradients (bf16 recipe, CPU) agree to two bf16 ulps of their largest element."""
  runs = {r: _block_residuals(r) for r in ("none", "norms", "norms_swiglu")}
  count = lambda r, what: runs[r][0].count(what)
  assert [count(r, "f32[2,16,64]") for r in runs] == [6, 0, 0]
  assert count("none", "bf16[2,16,128]") - count("norms_swiglu", "bf16[2,16,128]") == 3  # silu's intermediates
  assert count("norms", "bf16[2,16,128]") == count("none", "bf16[2,16,128]")
  for r in ("norms", "norms_swiglu"):
    assert runs[r][1] == runs["none"][1]
    for a, b in zip(jax.tree.leaves(runs["none"][2]), jax.tree.leaves(runs[r][2]), strict=True):
      a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
      # bf16 gradients whose terms differ by the roundings of the recomputed norm's input gradient (one bf16 ulp,
      # 2^-7 relative, each) and the residual stream's two paths: two ulps at the top binade
      assert np.max(np.abs(a - b)) <= 2.0**-6 * np.max(np.abs(a)), (r, float(np.max(np.abs(a - b))))


def test_auto_recompute_is_norms_swiglu_in_fp4_blocks_and_none_in_bf16_blocks():
  """The default: an FP4 block saves what "norms_swiglu" saves (no float32 norm intermediates, three fewer bf16
  ones of the SiLU), a BF16 block what "none" saves, with the same output and gradient bits as "none"."""
  assert m.ModelConfig(n_layers=1, d_model=64, n_heads=2, ffn_hidden=128).recompute == "auto"
  bf16_auto, bf16_none = _block_residuals("auto"), _block_residuals("none")
  assert bf16_auto[0] == bf16_none[0] and bf16_auto[0].count("f32[2,16,64]") == 6
  assert bf16_auto[1] == bf16_none[1]
  for a, b in zip(jax.tree.leaves(bf16_auto[2]), jax.tree.leaves(bf16_none[2]), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  fp4_auto, fp4_none = (_block_residuals(r, "nvidia_nvfp4", grads=False) for r in ("auto", "none"))
  assert fp4_auto[0].count("f32[2,16,64]") == 0 and fp4_none[0].count("f32[2,16,64]") == 6
  assert fp4_none[0].count("bf16[2,16,128]") - fp4_auto[0].count("bf16[2,16,128]") == 3
  assert fp4_auto[1] == fp4_none[1]  # the forward: same bits


def test_the_final_norm_recomputes_only_when_asked():
  """The final norm is outside the FP4 stacks: "auto" leaves it saved, an explicit "norms" recomputes it."""
  config = lambda r: m.ModelConfig(
    n_layers=1, d_model=64, n_heads=2, ffn_hidden=128, recipe="nvidia_nvfp4", recompute=r
  )
  assert config("auto").block_recompute(m.BF16_RECIPE) == "none"
  assert config("norms").block_recompute(m.BF16_RECIPE) == "norms"
  assert config("auto").block_recompute("nvidia_nvfp4") == "norms_swiglu"
  assert config("none").block_recompute("nvidia_nvfp4") == "none"


def test_recompute_must_be_a_known_mode():
  with pytest.raises(
    ValueError, match=r"recompute must be one of \('auto', 'none', 'norms', 'norms_swiglu'\), got 'all'"
  ):
    m.model_config("100K", recompute="all")


@pytest.mark.parametrize("bad", [0, -2, "all", 1.5, True, False])
def test_scan_unroll_must_be_auto_or_positive(bad):
  with pytest.raises(ValueError, match="scan_unroll must be 'auto' or a positive int"):
    m.model_config("100K", scan_unroll=bad)


def test_auto_unroll_unrolls_bf16_and_listed_fp4_stacks_and_the_threefry_kernel_follows(monkeypatch):
  """scan_unroll="auto": the BF16 stacks (first, last, or a BF16 model's) run whole, and so does a dense model's
  nvidia_nvfp4 or quartet2 stack (model.UNROLLED_RECIPES) where GPU kernels quantize; ms_fp4's stack, an MoE
  model's FP4 stack, and any FP4 stack with XLA's quantizers or on a device without the kernels (this CPU) one block
  per iteration; an explicit k is capped by the stack's length. threefry_kernel="auto" is on exactly where an FP4
  stack runs more than one block per iteration."""
  unroll = lambda c: {s.name: c.stack_unroll(s) for s in m.layer_stacks(c)}
  kernel = lambda c: c.jax_config()["jax_threefry_gpu_kernel_lowering"]
  config = m.model_config("100K", n_layers=6, recipe="ms_fp4", bf16_first=1, bf16_last=2)
  nvidia = dataclasses.replace(config, recipe="nvidia_nvfp4")
  quartet2 = dataclasses.replace(config, recipe="quartet2")
  cpu = {"first_blocks": 1, "blocks": 1, "last_blocks": 2}
  assert unroll(nvidia) == cpu and not kernel(nvidia)  # no kernels here: XLA's quantizers, the loop
  monkeypatch.setattr(fp4jax.backends, "has_pallas_triton", lambda device=None: True)  # a GPU with the kernels
  assert unroll(config) == cpu and not kernel(config)
  assert unroll(nvidia) == {"first_blocks": 1, "blocks": 3, "last_blocks": 2} and kernel(nvidia)
  assert unroll(quartet2) == unroll(nvidia) and kernel(quartet2)
  xla = dataclasses.replace(nvidia, quantizer_backend="xla")
  assert unroll(xla) == cpu and not kernel(xla)
  assert unroll(dataclasses.replace(config, scan_unroll=2)) == {"first_blocks": 1, "blocks": 2, "last_blocks": 2}
  assert kernel(dataclasses.replace(config, scan_unroll=2))  # ms_fp4 unrolled by 2: the kernels
  assert not kernel(dataclasses.replace(nvidia, scan_unroll=1))  # nvidia_nvfp4 in the loop: the rounds
  moe = m.model_config("1M-moe", recipe="nvidia_nvfp4")
  assert set(unroll(moe).values()) == {1} and not kernel(moe)
  bf16 = m.model_config("100K", n_layers=3)
  assert unroll(bf16) == {"blocks": 3} and not kernel(bf16)
  assert kernel(dataclasses.replace(bf16, threefry_kernel=True))
  assert not kernel(dataclasses.replace(nvidia, threefry_kernel=False))


@pytest.mark.parametrize("bad", [1, 0, "on", None])
def test_threefry_kernel_must_be_auto_or_a_bool(bad):
  with pytest.raises(ValueError, match=f"threefry_kernel must be 'auto', True or False, got {bad!r}"):
    m.model_config("100K", threefry_kernel=bad)


# slow tier; default representative: test_auto_unroll_unrolls_bf16_and_listed_fp4_stacks_and_the_threefry_kernel_follows
# (the stacks' unroll) and test_scanned_stacks_equal_blocks_applied_one_by_one (the stacks as "auto" runs them)
@pytest.mark.slow
def test_auto_unroll_lowers_unrolled_stacks_without_a_device_loop(monkeypatch):
  """The lowered forward pass: a BF16 model and (where the kernels run: emulated, the quantizers here are XLA's) a
  dense nvidia_nvfp4 or quartet2 model have no loop over their blocks under "auto", ms_fp4's blocks run in one."""
  monkeypatch.setattr(fp4jax.backends, "has_pallas_triton", lambda device=None: True)
  tokens = jnp.zeros((1, 8), jnp.int32)

  def loops(config):  # while loops in the lowered forward pass
    params = m.init_params(config, jax.random.key(0))
    apply = lambda p: m.Llama(config).apply({"params": p}, tokens, rngs={"quant": jax.random.key(1)})
    return jax.jit(apply).lower(params).as_text().count("stablehlo.while")

  assert loops(m.model_config("100K", n_layers=3)) == 0
  assert loops(m.model_config("100K", n_layers=3, scan_unroll=1)) == 1
  for recipe, auto in (("ms_fp4", 1), ("quartet2", 3), ("nvidia_nvfp4", 3)):  # their quantizers have loops of their own
    fp4 = m.model_config("100K", n_layers=3, recipe=recipe)
    assert loops(fp4) == loops(dataclasses.replace(fp4, scan_unroll=auto))
    assert loops(fp4) != loops(dataclasses.replace(fp4, scan_unroll=4 - auto))


# slow tier; default representative: test_scanned_stacks_equal_blocks_applied_one_by_one (the stacks' blocks in order)
@pytest.mark.slow
@pytest.mark.parametrize(
  "recipe, how",
  [
    ("bf16", {"remat": True}),
    ("bf16", {"scan_unroll": 3}),
    ("nvidia_nvfp4", {"scan_unroll": 8}),  # an unrolled FP4 compile
  ],
)
def test_remat_and_unroll_compute_the_same_gradients(recipe, how):
  """Recomputing or unrolling the blocks changes how, not what: the same gradients, with the same per-layer
  quantization bits (nvidia_nvfp4 rounds its gradients stochastically from the "quant" stream)."""
  if recipe != "bf16":
    pytest.importorskip("fp4jax.flax.linen")
  # 4 BF16 blocks unrolled by 3: a loop and a remainder; 2 FP4 blocks unrolled by 8: no loop
  config = m.model_config("100K", vocab_size=64, recipe=recipe, n_layers=4 if recipe == "bf16" else 2)
  params = m.init_params(config, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 64)

  def grads(config):
    loss = lambda p: jnp.mean(m.Llama(config).apply({"params": p}, tokens, rngs={"quant": jax.random.key(2)}) ** 2)
    return jax.jit(jax.grad(loss))(params)

  looped = dataclasses.replace(config, scan_unroll=1)
  for plain, other in zip(jax.tree.leaves(grads(looped)), jax.tree.leaves(grads(dataclasses.replace(config, **how)))):
    np.testing.assert_allclose(plain, other, rtol=1e-5, atol=1e-7)


# slow tier; default representative: test_layer_stacks_follow_the_bf16_policy (the plan), test_exp_moe.py's
# test_moe_layer_recipes_follow_the_bf16_policy (the model's stacks take it), test_exp_causal.py [fp8] (quantized run)
@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["nvidia_nvfp4", "quartet2"])
def test_fp4_model_keeps_first_and_last_blocks_in_bf16(recipe):
  pytest.importorskip("fp4jax.flax.linen")
  from fp4jax._src.flax.linen import DotGeneral

  config = m.model_config("100K", n_layers=4, recipe=recipe, bf16_first=1, bf16_last=1)
  params = m.init_params(config, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 32), 0, 256)
  fp4_init = jax.eval_shape(lambda k: m.Llama(config).init({"params": k, "quant": k}, tokens), jax.random.key(0))
  assert jax.tree.structure(fp4_init["params"]) == jax.tree.structure(params)  # init_params' BF16 route is exact
  seen = {}

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, nn.Dense) and context.method_name == "__call__":
      seen["/".join(context.module.scope.path)] = context.module.dot_general_cls is not None
    if isinstance(context.module, DotGeneral) and context.method_name == "__call__":  # the key each layer draws
      context.module.sow("intermediates", "key", jax.random.key_data(context.module.make_rng("quant")))
    return next_fun(*args, **kwargs)

  def forward(params, tokens, key):
    with nn.intercept_methods(record):
      return m.Llama(config).apply({"params": params}, tokens, rngs={"quant": key}, mutable=["intermediates"])

  logits, state = jax.jit(forward)(params, tokens, jax.random.key(2))
  assert np.isfinite(logits).all()
  assert not seen["first_blocks/attn/q"] and not seen["last_blocks/mlp/down"] and not seen["lm_head"]
  assert seen["blocks/attn/q"] and seen["blocks/mlp/down"]
  keys = np.asarray(state["intermediates"]["blocks"]["attn"]["q"]["DotGeneral_0"]["key"][0])
  assert keys.shape[0] == 2 and not np.array_equal(keys[0], keys[1])  # "quant" is split per scanned layer
  reference = jax.jit(m.Llama(dataclasses.replace(config, recipe="bf16")).apply)({"params": params}, tokens)
  assert 0 < float(jnp.mean((logits - reference) ** 2)) < float(jnp.mean(reference**2))


# slow tier; default representative: none cheaper (an FP4 model compile); the layers it lists follow the plan of
# test_layer_stacks_follow_the_bf16_policy
@pytest.mark.slow
def test_projection_quant_errors_name_every_fp4_layer():
  pytest.importorskip("fp4jax.flax.linen")
  from fp4jax_experiments import diagnostics

  config = m.model_config("100K", n_layers=3, recipe="nvidia_nvfp4", bf16_first=1)
  params = m.init_params(config, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 32), 0, 256)
  errors = diagnostics.projection_quant_errors(m.Llama(config), params, tokens, jax.random.key(2))
  projections = ("attn/q", "attn/k", "attn/v", "attn/o", "mlp/gate", "mlp/up", "mlp/down")
  assert set(errors) == {f"block_{layer}/{p}" for layer in (1, 2) for p in projections}
  assert all(0 < e < 0.1 for e in errors.values()), errors  # NVFP4 relative MSE of Gaussian-like data: ~1e-2


def _dots_given_prequantized_weights(config, params, tokens) -> list[bool]:
  """Per traced fp4jax DotGeneral call of the forward (nn.scan traces its block more than once; a block has seven):
  whether it received its kernel's prequantized operands."""
  from fp4jax._src.flax.linen import DotGeneral

  seen = []

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, DotGeneral) and context.method_name == "__call__":
      seen.append(context.module.rhs_prequantized is not None)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    jax.eval_shape(lambda p: m.Llama(config).apply({"params": p}, tokens, rngs={"quant": jax.random.key(2)}), params)
  return seen


def test_prequantized_weights_are_each_layers_dense_kernel_as_its_dot_receives_it():
  """``prequantize_weights``: the FP4 stack's seven projections receive prequantized operands, and those of layer
  l are ``fp4jax.prequantize_weight`` of layer l's kernel promoted to the model's dtype, as ``nn.Dense`` passes it
  to its dot (fp4jax's tests: such operands are the bits the dot would draw)."""
  pytest.importorskip("fp4jax.flax.linen")
  config = m.model_config("100K", vocab_size=64, recipe="nvidia_nvfp4", n_layers=3, bf16_first=1)
  params = m.init_params(config, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 64)
  ahead, in_loop = config, dataclasses.replace(config, prequantize_weights=False)  # the default: prequantized
  given, own = (_dots_given_prequantized_weights(c, params, tokens) for c in (ahead, in_loop))
  assert len(given) % 7 == 0 and all(given) and len(own) == len(given) and not any(own)
  first, blocks = m.layer_stacks(ahead)
  assert m.Llama(ahead).apply({"params": params}, first, method=m.Llama.prequantized) is None  # BF16
  pre = jax.jit(lambda p: m.Llama(ahead).apply({"params": p}, blocks, method=m.Llama.prequantized))(params)
  dense = (((2,), (0,)), ((), ()))
  for part, names in m.PROJECTIONS:
    for name in names:
      kernels = params["blocks"][part][name]["kernel"]
      for layer in range(blocks.length):
        want = fp4jax.prequantize_weight(kernels[layer].astype(jnp.bfloat16), dense, recipe="nvidia_nvfp4")
        got = jax.tree.map(lambda a: a[layer], pre[part][name])
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
          np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


# slow tier; default representatives: test_prequantized_weights_are_each_layers_dense_kernel_as_its_dot_receives_it
# and tests/test_prequantize.py (prequantized operands are the dot's own bits)
@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["nvidia_nvfp4", "quartet", "quartet2", "ms_fp4"])
def test_prequantized_weights_change_how_not_what(recipe):
  """``prequantize_weights``: the loss and every gradient are the same bits as the projections quantizing their
  weights in the loop."""
  pytest.importorskip("fp4jax.flax.linen")
  config = m.model_config("100K", vocab_size=64, recipe=recipe, n_layers=3, bf16_first=1)
  params = m.init_params(config, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 64)
  in_loop = dataclasses.replace(config, prequantize_weights=False)

  def value_and_grads(config):
    loss = lambda p: jnp.mean(m.Llama(config).apply({"params": p}, tokens, rngs={"quant": jax.random.key(2)}) ** 2)
    return jax.jit(jax.value_and_grad(loss))(params)

  for a, b in zip(jax.tree.leaves(value_and_grads(in_loop)), jax.tree.leaves(value_and_grads(config))):
    np.testing.assert_array_equal(a, b)


@pytest.mark.usefixtures("published_recipes_only")
def test_prequantize_weights_leaves_a_recipe_it_refuses_in_the_loop():
  pytest.importorskip("fp4jax.flax.linen")
  rotated = fp4jax.recipes.OperandSpec(fmt=fp4jax.NVFP4, hadamard=16, signs="random")  # drawn per call
  fp4jax.recipes.register(
    dataclasses.replace(fp4jax.recipes.get("nvfp4_rtn"), name="w_signs_drawn", fwd_lhs=rotated, fwd_rhs=rotated)
  )
  config = m.model_config("100K", vocab_size=64, recipe="w_signs_drawn", n_layers=2)  # prequantize_weights: default
  params = m.init_params(config, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 64)
  seen = _dots_given_prequantized_weights(config, params, tokens)
  assert len(seen) % 7 == 0 and seen and not any(seen)
