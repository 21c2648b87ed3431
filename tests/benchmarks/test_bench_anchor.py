"""benchmarks/anchor.py: the plain-JAX Llama against a NumPy forward, the experiments model's shapes, and its loss."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import anchor
from fp4jax_experiments import model as model_lib


def _np_rms_norm(x, g, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def _np_rope(x, theta):
  """Rotate-half RoPE on (batch, seq, heads, head_dim): pairs (i, i + D/2) rotated by t·θ^(−2i/D)."""
  seq, dim = x.shape[1], x.shape[3]
  angles = np.arange(seq)[:, None] * theta ** (-np.arange(0, dim, 2) / dim)[None, :]
  cos, sin = np.cos(angles)[None, :, None, :], np.sin(angles)[None, :, None, :]
  x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _np_attention(q, k, v):
  """Causal softmax(q kᵀ / sqrt(D)) v per head, (batch, seq, heads, D), in float64."""
  scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  seq = q.shape[1]
  scores = np.where(np.tril(np.ones((seq, seq), bool)), scores, -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhd->bqhd", weights, v)


def _np_forward(params, tokens, cfg):
  """The architecture of the anchor's module docstring, written out in float64."""
  p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  batch, seq = tokens.shape
  heads = (batch, seq, cfg.n_heads, cfg.d_model // cfg.n_heads)
  h = p64["embed"][tokens]
  for p in p64["layers"]:
    x = _np_rms_norm(h, p["attn_norm"], cfg.norm_eps)
    q, k, v = ((x @ p[name]).reshape(heads) for name in ("q", "k", "v"))
    y = _np_attention(_np_rope(q, cfg.rope_theta), _np_rope(k, cfg.rope_theta), v)
    h = h + y.reshape(batch, seq, cfg.d_model) @ p["o"]
    x = _np_rms_norm(h, p["mlp_norm"], cfg.norm_eps)
    gate = x @ p["gate"]
    h = h + (gate / (1 + np.exp(-gate)) * (x @ p["up"])) @ p["down"]
  return _np_rms_norm(h, p64["final_norm"], cfg.norm_eps) @ p64["lm_head"]


def test_forward_equals_numpy_in_fp32():
  cfg = anchor.AnchorConfig(n_layers=2, d_model=32, n_heads=4, ffn_hidden=48, vocab_size=40, dtype=jnp.float32)
  # weights of unit-scale effect (std 1/sqrt(fan-in)) and gains away from 1, so that every part shows in the logits
  shapes = jax.tree.map(lambda a: a.shape, jax.eval_shape(lambda: anchor.init_params(cfg, jax.random.key(0))))
  rng = np.random.default_rng(0)
  params = jax.tree.map(
    lambda s: (rng.normal(size=s) / math.sqrt(s[0]) if len(s) == 2 else rng.uniform(0.5, 1.5, s)).astype(np.float32),
    shapes,
    is_leaf=lambda s: isinstance(s, tuple),
  )
  batch = rng.integers(0, cfg.vocab_size, (3, 13)).astype(np.int32)
  got = np.asarray(jax.jit(anchor.forward, static_argnums=2)(params, batch[:, :-1], cfg), np.float64)
  want = _np_forward(params, batch[:, :-1], cfg)
  assert got.shape == (3, 12, cfg.vocab_size) and np.std(want) > 0.3
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
  # the loss: mean over tokens of logsumexp(logits) − the logit of the next token
  shifted = want - want.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  want_loss = -np.take_along_axis(log_probs, batch[:, 1:, None], -1).mean()
  assert float(jax.jit(anchor.loss_fn, static_argnums=2)(params, batch, cfg)) == pytest.approx(want_loss, rel=1e-5)


DENSE = [name for name, row in model_lib.SIZES.items() if not row.num_experts]
MOE = [name for name, row in model_lib.SIZES.items() if row.num_experts]


@pytest.mark.parametrize("size", DENSE)
def test_parameter_count_is_the_experiments_models(size):
  assert (
    anchor.parameter_count(anchor.anchor_config(size))
    == model_lib.parameter_count(model_lib.model_config(size))["total"]
  )


@pytest.mark.parametrize("size", MOE)
def test_a_mixture_of_experts_size_has_no_dense_anchor(size):
  with pytest.raises(ValueError, match=f"size '{size}' is a mixture of experts"):
    anchor.anchor_config(size)


def test_shapes_are_the_experiments_models_layer_by_layer():
  cfg = anchor.anchor_config("100K")
  mine = sorted(x.shape for x in jax.tree.leaves(jax.eval_shape(lambda: anchor.init_params(cfg, jax.random.key(0)))))
  theirs = jax.eval_shape(lambda: model_lib.init_params(model_lib.model_config("100K"), jax.random.key(0)))
  unstacked = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(theirs):
    stacked = any(getattr(k, "key", None) in model_lib.STACK_NAMES for k in path)  # scan: a leading layer axis
    unstacked += [leaf.shape[1:]] * leaf.shape[0] if stacked else [leaf.shape]
  assert mine == sorted(unstacked)


def test_flops_per_token_is_6n_plus_attention():
  cfg = anchor.anchor_config("1M")
  n = model_lib.parameter_count(model_lib.model_config("1M"))["total"]
  assert anchor.flops_per_token(cfg, 256) == 6 * n + 12 * 4 * 128 * 256


# slow tier; default representative: test_forward_equals_numpy_in_fp32 (the forward and loss_fn against NumPy)
@pytest.mark.slow
def test_loss_at_init_is_ln_vocab():
  """Logits z = x·W_head with RMSNorm(x) of unit RMS and W_head ~ N(0, σ²): z_j ~ N(0, s²), s² = σ²·d, so
  E[CE] = E[logsumexp z − z_target] ≈ ln V + s²/2 (second order in s) for targets independent of W_head; the mean
  over N tokens fluctuates by about s/sqrt(N) (the target logit's sd)."""
  cfg = anchor.anchor_config("100K")
  batch = np.random.default_rng(1).integers(0, 256, (8, 65)).astype(np.int32)
  loss = float(anchor.loss_fn(anchor.init_params(cfg, jax.random.key(1)), batch, cfg))
  s = anchor.INIT_STD * math.sqrt(cfg.d_model)
  assert abs(loss - (math.log(256) + s**2 / 2)) < 5 * s / math.sqrt(batch[:, 1:].size) + s**2


# slow tier; default representative: test_every_projection_gemm_of_the_bf16_train_step_is_bf16 (the step's program)
@pytest.mark.slow
def test_training_steps_reduce_the_loss_on_a_repeated_batch():
  cfg = anchor.anchor_config("100K")
  trainer = anchor.Trainer(cfg, anchor.make_optimizer(3e-3, 12), anchor.data_mesh(1))
  state = trainer.init_state(jax.random.key(0))
  batch = trainer.place(np.random.default_rng(2).integers(0, 256, (4, 65)).astype(np.int32))
  step = trainer.jitted_step()
  losses = []
  for _ in range(12):
    state, loss = step(state, batch)
    losses.append(float(loss))
  assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.5


def test_bad_inputs_are_refused():
  with pytest.raises(ValueError, match="attention must be"):
    anchor.anchor_config("100K", attention="flash")
  with pytest.raises(ValueError, match="tokens must have shape"):
    anchor.forward(
      anchor.init_params(anchor.anchor_config("100K"), jax.random.key(0)),
      jnp.zeros((4,), jnp.int32),
      anchor.anchor_config("100K"),
    )
  with pytest.raises(ValueError, match="devices asked for"):
    anchor.data_mesh(len(jax.devices()) + 1)


def _dots(jaxpr) -> list:
  """Every dot_general equation of ``jaxpr`` and of the jaxprs nested in it (pjit, custom_vjp, ...)."""
  out = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      out.append(eqn)
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          out += _dots(inner)
  return out


def test_every_projection_gemm_of_the_bf16_train_step_is_bf16():
  """The step's projection GEMMs take bf16 operands (fp32 master weights cast once per use), forward and backward;
  only the LM head's two backward GEMMs see a float32 operand (its fp32 logits' cotangent). A float32 preferred
  element type on the hidden GEMMs would turn their backward GEMMs into fp32 (TF32) ones. (Attention's GEMMs, rank
  4+ here on the CPU's XLA attention, are cuDNN's on a GPU and left out.)"""
  cfg = anchor.AnchorConfig(n_layers=2, d_model=32, n_heads=4, ffn_hidden=48, vocab_size=40)
  params = anchor.init_params(cfg, jax.random.key(0))
  batch = jnp.zeros((2, 9), jnp.int32)
  jaxpr = jax.make_jaxpr(jax.grad(anchor.loss_fn), static_argnums=2)(params, batch, cfg).jaxpr
  projections = [e for e in _dots(jaxpr) if max(v.aval.ndim for v in e.invars) <= 3]
  # forward, dX and dW of 7 projections per layer and the LM head; the one-hot embedding has no dX
  assert len(projections) == 3 * 7 * cfg.n_layers + 3 + 2
  fp32 = [[v.aval.shape for v in e.invars] for e in projections if any(v.aval.dtype == jnp.float32 for v in e.invars)]
  assert len(fp32) == 2 and all(shapes[0][-1] == cfg.vocab_size for shapes in fp32), fp32
