"""The plain-JAX anchor of the training-throughput benchmark: a Llama of the experiments model's shape, built plainly.

  h_0     = onehot(tokens) · E                                   (a GEMM; E untied from the LM head)
  h'_l    = h_l  + o( attention(RoPE(q(x)), RoPE(k(x)), v(x)) ),     x = RMSNorm(h_l)
  h_{l+1} = h'_l + down( silu(gate(x)) ⊙ up(x) ),                     x = RMSNorm(h'_l)
  logits  = RMSNorm(h_L) · W_head                                (fp32)
  RMSNorm(x) = g ⊙ x / sqrt(mean(x²) + ε)                        (fp32, rounded once to the activation dtype)
  RoPE: rotate-half, ω_i = θ^(−2i/head_dim), in fp32          attention: causal softmax(q kᵀ / sqrt(head_dim)) v
  loss = mean over tokens of −log softmax(logits)[next token]    (fp32)

Shapes come from ``fp4jax_experiments.model.model_config(size)`` (layers, width, heads, SwiGLU hidden, vocabulary
256), with no biases; the initialization is the experiments model's (every weight N(0, 0.02²), o and down
N(0, (0.02/sqrt(2L))²), norm gains 1). How it runs is what makes it an anchor: parameters are fp32 master weights
in a list of per-layer dicts, the layers are unrolled in a Python loop (no scan), activations and GEMM operands are
in ``dtype`` (bf16) with fp32 accumulation, attention is ``jax.nn.dot_product_attention`` (cuDNN's fused kernel on
a GPU, XLA's otherwise), the optimizer is optax AdamW with global-norm clipping, and the jitted train step donates
its state. Data parallel: the state replicated and the batch split over the devices of a one-axis mesh ``"data"``
(``jax.sharding.NamedSharding``); XLA adds the gradient all-reduce.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fp4jax_experiments import model as model_lib

Attention = Literal["cudnn", "xla"]
INIT_STD = 0.02
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class AnchorConfig:
  """Shape and execution of the anchor; :func:`anchor_config` builds it from the experiments' size table."""

  n_layers: int
  d_model: int
  n_heads: int
  ffn_hidden: int
  vocab_size: int = 256
  rope_theta: float = 1e4
  norm_eps: float = 1e-6
  dtype: Any = jnp.bfloat16
  attention: Attention = "xla"

  def __post_init__(self):
    if self.attention not in ("cudnn", "xla"):
      raise ValueError(f"attention must be 'cudnn' or 'xla', got {self.attention!r}")
    if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
      raise ValueError(f"d_model={self.d_model} must split into n_heads={self.n_heads} heads of even width")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads


def default_attention() -> Attention:
  """cuDNN's fused attention on a GPU, XLA's elsewhere."""
  return "cudnn" if jax.default_backend() == "gpu" else "xla"


def anchor_config(size: str, **overrides) -> AnchorConfig:
  """The anchor of the experiments model's size ``size`` (a key of ``fp4jax_experiments.model.SIZES``).

  Raises:
    ValueError: for a mixture-of-experts size (the anchor is a dense model).
  """
  c = model_lib.model_config(size)
  if c.num_experts:
    raise ValueError(f"size {size!r} is a mixture of experts ({c.num_experts} experts); the anchor is dense")
  shape = {
    "n_layers": c.n_layers,
    "d_model": c.d_model,
    "n_heads": c.n_heads,
    "ffn_hidden": c.ffn_hidden,
    "vocab_size": c.vocab_size,
    "rope_theta": c.rope_theta,
    "norm_eps": c.norm_eps,
  }
  return AnchorConfig(**{**shape, **overrides})


def init_params(config: AnchorConfig, key: jax.Array) -> dict:
  """fp32 parameters: {"embed" (V, d), "layers": [per-layer dict], "final_norm" (d,), "lm_head" (d, V)}."""
  d, h, v, n = config.d_model, config.ffn_hidden, config.vocab_size, config.n_layers
  shapes = {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d), "gate": (d, h), "up": (d, h), "down": (h, d)}
  out_std = INIT_STD / math.sqrt(2 * n)
  keys = iter(jax.random.split(key, 2 + n * len(shapes)))
  normal = lambda shape, std: std * jax.random.normal(next(keys), shape, jnp.float32)
  layers = []
  for _ in range(n):
    layer = {name: normal(shape, out_std if name in ("o", "down") else INIT_STD) for name, shape in shapes.items()}
    layers.append({**layer, "attn_norm": jnp.ones((d,), jnp.float32), "mlp_norm": jnp.ones((d,), jnp.float32)})
  return {
    "embed": normal((v, d), INIT_STD),
    "layers": layers,
    "final_norm": jnp.ones((d,), jnp.float32),
    "lm_head": normal((d, v), INIT_STD),
  }


def parameter_count(config: AnchorConfig) -> int:
  """The number of parameters, counted from the shapes :func:`init_params` makes."""
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))


def flops_per_token(config: AnchorConfig, seq_len: int) -> float:
  """6·N + 12·L·d·T: the training FLOPs of one token, the formula of ``fp4jax_experiments.bench_scaling``."""
  return 6 * parameter_count(config) + 12 * config.n_layers * config.d_model * seq_len


def _matmul(x: jax.Array, w: jax.Array, dtype) -> jax.Array:
  # ``dtype`` in and out (GPU GEMMs accumulate bf16 in fp32): with preferred_element_type=float32 and a cast after,
  # the transposed GEMMs of the backward would take the float32 cotangent and run in fp32/TF32
  return jnp.dot(x.astype(dtype), w.astype(dtype))


def _rms_norm(x: jax.Array, gain: jax.Array, eps: float) -> jax.Array:
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps) * gain).astype(x.dtype)


def _rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def forward(params: dict, tokens: jax.Array, config: AnchorConfig) -> jax.Array:
  """tokens int (batch, seq) → logits fp32 (batch, seq, vocab)."""
  if tokens.ndim != 2:
    raise ValueError(f"tokens must have shape (batch, seq), got {tokens.shape}")
  dt, (batch, seq) = config.dtype, tokens.shape
  heads = (batch, seq, config.n_heads, config.head_dim)
  inv_freq = config.rope_theta ** (-jnp.arange(0, config.head_dim, 2, dtype=jnp.float32) / config.head_dim)
  angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv_freq[None, :]
  cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
  h = _matmul(jax.nn.one_hot(tokens, config.vocab_size, dtype=dt), params["embed"], dt)
  for p in params["layers"]:
    x = _rms_norm(h, p["attn_norm"], config.norm_eps)
    q, k, v = (_matmul(x, p[name], dt).reshape(heads) for name in ("q", "k", "v"))
    y = jax.nn.dot_product_attention(
      _rope(q, cos, sin), _rope(k, cos, sin), v, is_causal=True, implementation=config.attention
    )
    h = h + _matmul(y.reshape(batch, seq, config.d_model), p["o"], dt)
    x = _rms_norm(h, p["mlp_norm"], config.norm_eps)
    h = h + _matmul(jax.nn.silu(_matmul(x, p["gate"], dt)) * _matmul(x, p["up"], dt), p["down"], dt)
  x = _rms_norm(h, params["final_norm"], config.norm_eps)
  return jnp.dot(x, params["lm_head"].astype(dt), preferred_element_type=jnp.float32)


def loss_fn(params: dict, batch: jax.Array, config: AnchorConfig) -> jax.Array:
  """Mean next-token cross-entropy (fp32) of ``batch`` int (rows, seq + 1): inputs ``batch[:, :-1]``."""
  logits = forward(params, batch[:, :-1], config)
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()


def make_optimizer(peak_lr: float, total_steps: int, weight_decay: float = 0.1) -> optax.GradientTransformation:
  """Global-norm clipping at 1, then AdamW (0.9, 0.95) decaying matrices only; lr: linear warmup over 10% of the
  steps from peak/100, then cosine to peak/10 (the experiments' schedule shape)."""
  warmup = min(math.ceil(0.1 * total_steps), total_steps - 1)
  schedule = optax.warmup_cosine_decay_schedule(peak_lr / 100, peak_lr, warmup, total_steps, peak_lr / 10)
  mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
  return optax.chain(
    optax.clip_by_global_norm(1.0), optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=weight_decay, mask=mask)
  )


def data_mesh(n: int) -> Mesh:
  """A one-axis mesh ``"data"`` over the first ``n`` devices."""
  if not 1 <= n <= len(jax.devices()):
    raise ValueError(f"n={n} devices asked for, {len(jax.devices())} visible")
  return Mesh(np.array(jax.devices()[:n]), ("data",))


@dataclasses.dataclass(frozen=True)
class Trainer:
  """The anchor's state and train step on ``mesh``: ``jitted_step()(state, batch) -> (state, loss)``."""

  config: AnchorConfig
  optimizer: optax.GradientTransformation
  mesh: Mesh

  @property
  def state_sharding(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())

  @property
  def batch_sharding(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec("data"))

  def init_state(self, key: jax.Array) -> dict:
    params = init_params(self.config, key)
    return jax.device_put({"params": params, "opt_state": self.optimizer.init(params)}, self.state_sharding)

  def place(self, batch: np.ndarray) -> jax.Array:
    if batch.shape[0] % self.mesh.size:
      raise ValueError(f"batch of {batch.shape[0]} rows does not split over {self.mesh.size} devices")
    return jax.device_put(batch, self.batch_sharding)

  def jitted_step(self):
    """The jitted train step (state donated; the loss replicated)."""

    def train_step(state, batch):
      loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch, self.config)
      updates, opt_state = self.optimizer.update(grads, state["opt_state"], state["params"])
      return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss

    return jax.jit(
      train_step,
      donate_argnums=0,
      in_shardings=(self.state_sharding, self.batch_sharding),
      out_shardings=(self.state_sharding, NamedSharding(self.mesh, PartitionSpec())),
    )
