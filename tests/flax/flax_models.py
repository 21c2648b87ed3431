"""A small pre-norm transformer (causal attention + SwiGLU MLP) in linen and in NNX, written with plain Flax layers
so that the tests quantize it by rules, as a user would quantize a model they already have.

Every GEMM dimension is a multiple of 128 (d_model, SwiGLU hidden, tokens per batch), the largest Hadamard size a
recipe uses (Quartet II's 128-point RHT on the gradients), so every recipe runs on it. q/k/v and gate/up are fused
into one projection each (as in many LLMs), four quantized GEMMs per block: XLA's compile time of a quantized
fwd+bwd grows with the number of GEMMs and dominates these tests' runtime.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx


@dataclasses.dataclass(frozen=True)
class Config:
  vocab: int = 64
  d_model: int = 128
  n_heads: int = 2
  hidden: int = 128
  n_layers: int = 1
  dtype: object = jnp.bfloat16


def tokens(key, batch: int = 4, seq: int = 33, vocab: int = 64):
  """A fixed batch of token ids; inputs are [:, :-1] (4 x 32 = 128 tokens), targets [:, 1:]."""
  return jax.random.randint(key, (batch, seq), 0, vocab)


def loss_from_logits(logits, toks):
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), toks[:, 1:]).mean()


# ------------------------------------------------------------------------------------------------ linen
class LinenBlock(nn.Module):
  cfg: Config

  @nn.compact
  def __call__(self, h):
    c = self.cfg
    dense = lambda n, name: nn.Dense(n, use_bias=False, dtype=c.dtype, name=name)
    x = nn.RMSNorm(dtype=c.dtype, name="attn_norm")(h)
    b, s, _ = x.shape
    heads = (b, s, c.n_heads, c.d_model // c.n_heads)
    q, k, v = jnp.split(dense(3 * c.d_model, "qkv")(x).reshape(b, s, 3, *heads[2:]), 3, axis=2)
    y = jax.nn.dot_product_attention(q[:, :, 0], k[:, :, 0], v[:, :, 0], is_causal=True).reshape(b, s, c.d_model)
    h = h + dense(c.d_model, "o")(y)
    x = nn.RMSNorm(dtype=c.dtype, name="mlp_norm")(h)
    gate, up = jnp.split(dense(2 * c.hidden, "gate_up")(x), 2, axis=-1)
    return h + dense(c.d_model, "down")(nn.silu(gate) * up)


class LinenTransformer(nn.Module):
  cfg: Config

  @nn.compact
  def __call__(self, toks):
    c = self.cfg
    h = nn.Embed(c.vocab, c.d_model, dtype=c.dtype, name="embed")(toks)
    for i in range(c.n_layers):
      h = LinenBlock(c, name=f"block_{i}")(h)
    return nn.Dense(c.vocab, use_bias=False, dtype=c.dtype, name="lm_head")(nn.RMSNorm(dtype=c.dtype)(h))


class ScanBody(nn.Module):
  """One block as an ``nn.scan`` body: (carry, None) -> (carry, None)."""

  cfg: Config

  @nn.compact
  def __call__(self, h, _):
    return LinenBlock(self.cfg, name="block")(h), None


class LinenScanTransformer(nn.Module):
  """The same model with its blocks under ``nn.scan`` of ``nn.remat`` (one set of paths for all blocks)."""

  cfg: Config

  @nn.compact
  def __call__(self, toks):
    c = self.cfg
    h = nn.Embed(c.vocab, c.d_model, dtype=c.dtype, name="embed")(toks)
    blocks = nn.scan(
      nn.remat(ScanBody), variable_axes={"params": 0}, split_rngs={"params": True, "quant": True}, length=c.n_layers
    )
    h, _ = blocks(c, name="blocks")(h, None)
    return nn.Dense(c.vocab, use_bias=False, dtype=c.dtype, name="lm_head")(nn.RMSNorm(dtype=c.dtype)(h))


# ------------------------------------------------------------------------------------------------ NNX
class NnxBlock(nnx.Module):
  def __init__(self, c: Config, rngs: nnx.Rngs):
    self.c = c
    dense = lambda n_in, n_out: nnx.Linear(n_in, n_out, use_bias=False, dtype=c.dtype, rngs=rngs)
    self.attn_norm = nnx.RMSNorm(c.d_model, dtype=c.dtype, rngs=rngs)
    self.qkv, self.o = dense(c.d_model, 3 * c.d_model), dense(c.d_model, c.d_model)
    self.mlp_norm = nnx.RMSNorm(c.d_model, dtype=c.dtype, rngs=rngs)
    self.gate_up, self.down = dense(c.d_model, 2 * c.hidden), dense(c.hidden, c.d_model)

  def __call__(self, h):
    c = self.c
    x = self.attn_norm(h)
    b, s, _ = x.shape
    heads = (b, s, c.n_heads, c.d_model // c.n_heads)
    q, k, v = jnp.split(self.qkv(x).reshape(b, s, 3, *heads[2:]), 3, axis=2)
    h = h + self.o(
      jax.nn.dot_product_attention(q[:, :, 0], k[:, :, 0], v[:, :, 0], is_causal=True).reshape(b, s, c.d_model)
    )
    x = self.mlp_norm(h)
    gate, up = jnp.split(self.gate_up(x), 2, axis=-1)
    return h + self.down(nnx.silu(gate) * up)


class NnxTransformer(nnx.Module):
  def __init__(self, c: Config, rngs: nnx.Rngs):
    self.embed = nnx.Embed(c.vocab, c.d_model, dtype=c.dtype, rngs=rngs)
    self.blocks = nnx.List([NnxBlock(c, rngs) for _ in range(c.n_layers)])
    self.norm = nnx.RMSNorm(c.d_model, dtype=c.dtype, rngs=rngs)
    self.lm_head = nnx.Linear(c.d_model, c.vocab, use_bias=False, dtype=c.dtype, rngs=rngs)

  def __call__(self, toks):
    h = self.embed(toks)
    for block in self.blocks:
      h = block(h)
    return self.lm_head(self.norm(h))
