"""The optimizer of the Quartet training setup: AdamW (0.9, 0.95), weight decay 0.1, clip 1.0, warmup + cosine.

Learning rate at step t of T (warmup W = ⌈warmup_frac·T⌉ steps, peak η):
  t < W:   η_t = η/100 + (η − η/100)·t/W                                (linear warmup from η/100)
  t ≥ W:   η_t = η/10 + (η − η/10)·(1 + cos(π·(t − W)/(T − W)))/2       (cosine to η/10)
Updates: g ← g·min(1, clip/‖g‖₂) (global norm), then AdamW with decoupled weight decay λ·η_t·θ applied to matrices
(ndim ≥ 2: projections, embeddings, LM head) only; RMSNorm gains are not decayed.
"""

from __future__ import annotations

import math

import jax
import optax


def lr_schedule(peak_lr: float, total_steps: int, warmup_frac: float = 0.1) -> optax.Schedule:
  """The warmup + cosine schedule above."""
  if peak_lr <= 0:
    raise ValueError(f"peak_lr={peak_lr} must be positive")
  if total_steps < 1:
    raise ValueError(f"total_steps={total_steps} must be at least 1")
  if not 0 <= warmup_frac < 1:
    raise ValueError(f"warmup_frac={warmup_frac} must be in [0, 1)")
  warmup = min(math.ceil(warmup_frac * total_steps), total_steps - 1)
  return optax.warmup_cosine_decay_schedule(
    init_value=peak_lr / 100,
    peak_value=peak_lr,
    warmup_steps=warmup,
    decay_steps=total_steps,
    end_value=peak_lr / 10,
  )


def adamw(
  schedule: optax.Schedule, weight_decay: float = 0.1, clip_norm: float = 1.0, b1: float = 0.9, b2: float = 0.95
) -> optax.GradientTransformation:
  """Global-norm clipping followed by AdamW with weight decay on parameters of ndim ≥ 2."""
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
  return optax.chain(
    optax.clip_by_global_norm(clip_norm),
    optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay, mask=decay_mask),
  )
