"""Element and scale formats as objects: NVFP4, MXFP4, FP8 (E4M3, E5M2), MXFP8, FP8 block scaling and per-channel
E2M1.

Public names of ``fp4jax._src.formats`` (see there for the specifications).
"""

from fp4jax._src.formats import (
  E2M1_CHANNEL,
  E2M1_MAX,
  E2M1_VALUES,
  E4M3,
  E4M3_MAX,
  E5M2,
  FORMATS,
  FP8_BLOCK,
  MXFP4,
  MXFP8,
  NVFP4,
  BlockFormat,
  BlockFP8Format,
  E2M1ChannelFormat,
  Format,
  FP4Format,
  FP8BlockFormat,
  FP8Format,
  MXFP4Format,
  MXFP8Format,
  NVFP4Format,
  get,
)

__all__ = [
  "BlockFP8Format",
  "BlockFormat",
  "E2M1ChannelFormat",
  "E2M1_CHANNEL",
  "E2M1_MAX",
  "E2M1_VALUES",
  "E4M3",
  "E4M3_MAX",
  "E5M2",
  "FORMATS",
  "FP4Format",
  "FP8BlockFormat",
  "FP8Format",
  "FP8_BLOCK",
  "Format",
  "MXFP4",
  "MXFP4Format",
  "MXFP8",
  "MXFP8Format",
  "NVFP4",
  "NVFP4Format",
  "get",
]
