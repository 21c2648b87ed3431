"""Packed FP4 weights as QTensors, and checksummed, atomic save / restore.

Public names of ``fp4jax._src.flax.export``.
"""

from fp4jax._src.flax.export import (
  CorruptCheckpointError,
  bytes_report,
  nbytes,
  pack,
  restore,
  save,
  unpack,
)

__all__ = [
  "CorruptCheckpointError",
  "bytes_report",
  "nbytes",
  "pack",
  "restore",
  "save",
  "unpack",
]
