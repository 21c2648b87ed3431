"""Four-over-six's block error metrics (``NVFP4Format.four_over_six_metric``: "mse", "l1", "max_abs") against the
NumPy oracle (tests/oracles.py) on hand-built blocks where the metrics disagree and on random blocks; the field's
validation, repr and export metadata."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax import formats
from fp4jax._src.flax import export
from tests import oracles

F32 = np.float32
METRICS = ("mse", "l1", "max_abs")


def _fmt(metric):
  return dataclasses.replace(fp4jax.NVFP4, scale_mode="four_over_six", four_over_six_metric=metric)


def _quantized(x, fmt):
  q = fp4jax.quantize(jnp.asarray(x), fmt, hadamard=0)
  deq = fp4jax.fake_quantize(jnp.asarray(x), fmt, hadamard=0, dtype=jnp.float32)
  return np.asarray(q.scales.astype(jnp.float32)), np.asarray(deq)


# One block of max 1536 makes s_enc = s_dec = 1 (numerator 6·256); a block of max 12 then has the block scale 2
# (target 6: the grid 0, 1, 2, 3, 4, 6, 8, 12) or 3 (target 4: 0, 1.5, 3, 4.5, 6, 9, 12). RTN, ties to the even code.
#   9   -> 8 (error 1)   or 9 (0)        7.5 -> 8 (0.5)  or 6 (1.5, the tie 6|9 keeps the even code)
#   10  -> 8 (2, tie)    or 9 (1)        1   -> 1 (0)    or 1.5 (0.5)       0.5 -> 0 (0.5, tie) or 0 (0.5)
HAND_BLOCKS = {  # block: (errors, map-to-6 | map-to-4) -> the scale each metric keeps
  # e6 = 1 x6, 0.5: SSE 6.25, L1 6.5, max 1;  e4 = 1.5: SSE 2.25, L1 1.5, max 1.5
  "mse_l1_pick_4_max_abs_picks_6": ([12.0] + [9.0] * 6 + [7.5], {"mse": 3.0, "l1": 3.0, "max_abs": 2.0}),
  # e6 = 1 x3, 0.5 x2: SSE 3.5, L1 4, max 1;  e4 = 1.5 x2: SSE 4.5, L1 3, max 1.5
  "l1_picks_4_mse_max_abs_pick_6": ([12.0, 9.0, 9.0, 9.0, 7.5, 7.5], {"mse": 2.0, "l1": 3.0, "max_abs": 2.0}),
  # e6 = 2: SSE 4, L1 2, max 2;  e4 = 1, 0.5 x14: SSE 4.5, L1 8, max 1
  "max_abs_picks_4_mse_l1_pick_6": ([12.0, 10.0] + [1.0] * 14, {"mse": 2.0, "l1": 2.0, "max_abs": 3.0}),
  # e6 = e4 = 0.5 on the one element: a tie under every metric keeps 6
  "tie_keeps_6": ([12.0, 0.5], {"mse": 2.0, "l1": 2.0, "max_abs": 2.0}),
  # e6 = 1 (9 -> 8), e4 = 0: every metric picks 4
  "all_pick_4": ([12.0, 9.0], {"mse": 3.0, "l1": 3.0, "max_abs": 3.0}),
}


SHAPE = (64, 256)  # of every 1D test's tensor: each metric's quantizer programs are compiled once for the module


def _hand_tensor():
  """Row 0: the block of 1536 and ``HAND_BLOCKS``, one per 16-element block; every other element zero."""
  x = np.zeros(SHAPE, F32)
  x[0, 0] = 1536.0
  for i, (block, _) in enumerate(HAND_BLOCKS.values(), start=1):
    x[0, 16 * i : 16 * i + len(block)] = block
  return x


@pytest.mark.parametrize("metric", METRICS)
def test_hand_built_blocks_where_the_metrics_disagree(metric):
  x = _hand_tensor()
  scales, deq = _quantized(x, _fmt(metric))
  want = [256.0] + [picks[metric] for _, picks in HAND_BLOCKS.values()]  # 1536/6 (exact for both: a tie); HAND_BLOCKS
  want += [0.0] * (scales.shape[1] - len(want))  # the zero blocks after them
  np.testing.assert_array_equal(scales[0], want)
  np.testing.assert_array_equal(scales[1:], 0.0)
  vals, s_dec, dec = oracles.nvfp4(x, four_over_six=True, metric=metric)
  assert s_dec == 1.0
  np.testing.assert_array_equal(dec[0], want)
  np.testing.assert_array_equal(deq, oracles.fl(oracles.fl(vals) * s_dec))


def _random(seed, shape=SHAPE):
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal(shape) * np.exp2(rng.integers(-4, 5, (shape[0], 1)))).astype(F32)
  x[:, ::7] *= 3.0  # heavier tails: some blocks prefer the map-to-4 scale
  return x


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize(  # slow tier; default representative: [0-*] (every metric, another random tensor)
  "seed", [0, pytest.param(1, marks=pytest.mark.slow)]
)
def test_matches_the_oracle_on_random_blocks(metric, seed):
  x = _random(seed)
  scales, deq = _quantized(x, _fmt(metric))
  vals, s_dec, dec = oracles.nvfp4(x, four_over_six=True, metric=metric)
  np.testing.assert_array_equal(scales, dec)
  np.testing.assert_array_equal(deq, oracles.fl(oracles.fl(vals) * s_dec))
  s_enc, _ = oracles.nvfp4_tensor_scales(np.max(np.abs(x)), 1536.0)
  use4 = dec == oracles.nvfp4_block_dec(np.max(np.abs(x.reshape(64, 16, 16)), -1), s_enc, 4.0)
  assert 0.05 < np.mean(use4) < 0.95, np.mean(use4)  # both candidates occur


def test_the_metrics_choose_differently_on_random_blocks():
  """On the same random tensor each metric's choices differ from the others' on some blocks (so the option is
  not a relabeling) and each matches the oracle there (``test_matches_the_oracle_on_random_blocks``)."""
  x = _random(0)
  chosen = {m: _quantized(x, _fmt(m))[0] for m in METRICS}
  for a, b in (("mse", "l1"), ("mse", "max_abs"), ("l1", "max_abs")):
    assert np.any(chosen[a] != chosen[b]), (a, b)


@pytest.mark.parametrize(  # slow tier; default representative: [l1] (mse, max_abs: the 1D tests above)
  "metric", [pytest.param(m, marks=pytest.mark.slow) if m != "l1" else m for m in METRICS]
)
def test_two_dimensional_tiles_match_the_oracle(metric):
  x = _random(2, (64, 128))
  q = fp4jax.quantize(jnp.asarray(x), _fmt(metric), block_shape=(16, 16), hadamard=0)
  _, _, dec = oracles.nvfp4(x, tiles=True, four_over_six=True, metric=metric)
  np.testing.assert_array_equal(np.asarray(q.scales.astype(jnp.float32)), dec, err_msg=metric)


@pytest.mark.parametrize(
  ("make", "match"),
  [
    (lambda: _fmt("mae"), r"NVFP4Format\.four_over_six_metric must be one of \('mse', 'l1', 'max_abs'\)"),
    (lambda: formats.NVFP4Format(four_over_six_metric="l1"), r"four_over_six_metric='l1'.*scale_mode='four_over_six'"),
  ],
)
def test_bad_metric_names_the_field(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_repr_shows_a_metric_other_than_the_default():
  assert "four_over_six_metric" not in repr(_fmt("mse"))
  assert repr(_fmt("max_abs")) == (
    "NVFP4Format(name='nvfp4', block_size=16, scale_mode='four_over_six', four_over_six_metric='max_abs')"
  )
  assert _fmt("l1") != _fmt("mse")


def test_export_metadata_keeps_the_metric():
  for fmt in (_fmt("l1"), fp4jax.NVFP4, fp4jax.MXFP4):
    assert export._fmt_from_json(export._fmt_json(fmt)) == fmt
  # metadata written before the field existed loads with the default metric
  old = {"name": "nvfp4", "block_size": 16, "scale_mode": "four_over_six"}
  assert export._fmt_from_json(old) == _fmt("mse")
