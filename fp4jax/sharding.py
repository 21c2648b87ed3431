"""FP4 GEMMs on a device mesh with one-device numerics: sharded recipes, collective amax, ordered sums.

Public names of ``fp4jax._src.sharding`` (see there for the specifications).
"""

from fp4jax._src.sharding import (
  SPLIT_DIMS,
  ShardedRecipe,
  combine_amax,
  copy_to_shards,
  global_amax,
  ordered_psum,
  placement,
  sharded,
  sum_from_shards,
  token_sharded,
)

__all__ = [
  "SPLIT_DIMS",
  "ShardedRecipe",
  "combine_amax",
  "copy_to_shards",
  "global_amax",
  "ordered_psum",
  "placement",
  "sharded",
  "sum_from_shards",
  "token_sharded",
]
