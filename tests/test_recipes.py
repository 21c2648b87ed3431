"""The recipe registry and the choices each published recipe states."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import pytest

import fp4jax
from fp4jax._src import recipes
from fp4jax._src.recipes import OperandSpec, Recipe


def test_registry():
  assert recipes.names() == (
    "bf16",
    "fp8",
    "mxfp8",
    "fp8_block",
    "nvfp4_rtn",
    "nvidia_nvfp4",
    "quartet",
    "quartet2",
    "ms_fp4",
  )
  for name in recipes.names():
    r = recipes.get(name)
    assert isinstance(r, Recipe) and r.name == name
    assert recipes.get(r) is r
  with pytest.raises(ValueError, match="unknown recipe 'fp3'"):
    recipes.get("fp3")


def test_randomness_flags():
  random = {n for n in recipes.names() if recipes.get(n).is_random}
  assert random == {"nvidia_nvfp4", "quartet", "quartet2"}
  assert recipes.get("bf16").is_identity and not recipes.get("fp8").is_identity


def test_nvidia_nvfp4_choices():
  r = recipes.nvidia_nvfp4()
  assert r.fwd_lhs == OperandSpec(fmt=fp4jax.NVFP4)
  assert r.fwd_rhs.block_shape == (16, 16) and r.fwd_rhs.rounding == "rtn"
  assert r.dgrad_lhs.rounding == "sr" and r.dgrad_lhs.hadamard == 0
  assert r.dgrad_rhs == recipes.REUSE_FORWARD
  assert (r.wgrad_lhs.rounding, r.wgrad_lhs.hadamard, r.wgrad_lhs.signs) == ("sr", 16, "te")
  assert (r.wgrad_rhs.rounding, r.wgrad_rhs.hadamard, r.wgrad_rhs.signs, r.wgrad_rhs.source) == (
    "rtn",
    16,
    "te",
    "input",
  )


def test_quartet_choices():
  r = recipes.quartet()
  for spec in (r.fwd_lhs, r.fwd_rhs):
    assert (spec.fmt.name, spec.fmt.scale_mode, spec.rounding, spec.hadamard, spec.signs, spec.estimator) == (
      "mxfp4",
      "quest",
      "rtn",
      32,
      "none",
      "trust_mask",
    )
  for spec in (r.dgrad_lhs, r.dgrad_rhs, r.wgrad_lhs, r.wgrad_rhs):
    assert (spec.fmt.scale_mode, spec.rounding, spec.hadamard, spec.signs) == ("floor_headroom", "sr", 32, "random")
  assert r.dgrad_rhs.source == r.wgrad_rhs.source == "forward"


@pytest.mark.parametrize("four_over_six", [True, False])
def test_quartet2_choices(four_over_six):
  r = recipes.quartet2(four_over_six=four_over_six)
  assert r.fwd_lhs.fmt.scale_mode == ("four_over_six" if four_over_six else "absmax")
  for spec in (r.dgrad_lhs, r.dgrad_rhs, r.wgrad_lhs, r.wgrad_rhs):
    assert (spec.fmt.name, spec.rounding, spec.hadamard, spec.signs) == ("nvfp4", "eden", 128, "random")
  assert r.dgrad_rhs.source == r.wgrad_rhs.source == "forward"


@pytest.mark.parametrize("fp4_gradients", [False, True])
def test_ms_fp4_choices(fp4_gradients):
  r = recipes.ms_fp4(fp4_gradients=fp4_gradients, pow2_scale=True)
  assert (r.fwd_lhs.fmt, r.fwd_lhs.clip, r.fwd_lhs.clip_quantile, r.fwd_lhs.scale_pow2) == (
    fp4jax.formats.E2M1_CHANNEL,
    "occ",
    0.99,
    True,
  )
  assert (r.fwd_rhs.estimator, r.fwd_rhs.dge_k, r.fwd_rhs.dge_cap) == ("dge", 5.0, 3.0)
  assert r.dgrad_lhs.fmt == r.wgrad_lhs.fmt == (fp4jax.formats.E2M1_CHANNEL if fp4_gradients else fp4jax.formats.E5M2)
  assert r.dgrad_rhs == r.wgrad_rhs == OperandSpec(fmt=fp4jax.formats.E4M3, source="forward")


def test_variants_by_dataclasses_replace():
  r = recipes.nvidia_nvfp4()
  d128 = dataclasses.replace(
    r,
    wgrad_lhs=dataclasses.replace(r.wgrad_lhs, hadamard=128, signs="fixed"),
    wgrad_rhs=dataclasses.replace(r.wgrad_rhs, hadamard=128, signs="fixed"),
  )
  assert d128.wgrad_lhs.hadamard == 128 and r.wgrad_lhs.hadamard == 16
  assert hash(d128) != hash(r)  # frozen, hashable: usable as a static jit argument


@pytest.mark.parametrize(
  "make, match",
  [
    (lambda: OperandSpec(fmt=fp4jax.formats.E4M3, rounding="sr"), "needs an FP4Format"),
    (lambda: OperandSpec(fmt=fp4jax.NVFP4, hadamard=24), "Hadamard size"),
    (lambda: OperandSpec(fmt=fp4jax.NVFP4, hadamard=32, signs="te"), "Transformer Engine"),
    (lambda: OperandSpec(fmt=fp4jax.NVFP4, estimator="dge"), "dge"),
    (lambda: OperandSpec(fmt=fp4jax.formats.E4M3, estimator="trust_mask"), "trust_mask"),
    (lambda: OperandSpec(source="weights"), "source"),
    (lambda: Recipe("r", fwd_lhs=OperandSpec(fmt=fp4jax.NVFP4, hadamard=16)), "share the Hadamard"),
    (lambda: Recipe("r", dgrad_lhs=OperandSpec(source="forward")), "dgrad_lhs.source"),
    (lambda: Recipe("r", wgrad_lhs=OperandSpec(clip="occ")), "forward-only"),
    (
      lambda: dataclasses.replace(
        recipes.quartet(), dgrad_rhs=dataclasses.replace(recipes.quartet().dgrad_rhs, source="input")
      ),
      "trust_mask acts in the forward domain",
    ),
  ],
)
def test_invalid_specs_name_the_problem(make, match):
  with pytest.raises(ValueError, match=match):
    make()


# slow tier; default representative: [nvidia_nvfp4] (a random recipe: SR and RHT signs made deterministic, 2D tiles);
# every recipe's deterministic specs are also compared in tests/test_oracles_dot.py::test_deterministic_variant_*
@pytest.mark.parametrize(
  "name", [n if n == "nvidia_nvfp4" else pytest.param(n, marks=pytest.mark.slow) for n in recipes.names()]
)
def test_deterministic_variant_needs_no_key_and_keeps_formats(name):
  r = recipes.get(name)
  d = recipes.deterministic(name)
  assert not d.is_random
  for a, b in zip(r.specs, d.specs):
    assert (a.fmt, a.block_shape, a.hadamard, a.estimator, a.source) == (
      b.fmt,
      b.block_shape,
      b.hadamard,
      b.estimator,
      b.source,
    )
    assert b.rounding == "rtn" and b.signs != "random"
  if not r.is_random:
    assert d == r
  x = jnp.ones((128, 256), jnp.float32)
  w = jnp.ones((128, 256), jnp.float32) * 0.5
  y = fp4jax.dot_general(x, w, (((1,), (1,)), ((), ())), recipe=d)  # no key needed
  assert y.shape == (128, 128) and bool(jnp.all(jnp.isfinite(y)))
