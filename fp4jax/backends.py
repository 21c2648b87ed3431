"""Which implementation runs a quantize or an FP4 GEMM: ``"xla"`` (pure JAX), ``"pallas"`` (fp4jax_kernels, Triton
backend) or ``"native"`` (block-scaled FP4 tensor cores via ``jax.nn.scaled_matmul``). One small function per decision;
callers pass ``backend="auto"`` to get these, or name a backend to force it.
"""

from __future__ import annotations

import jax

BACKENDS = ("xla", "pallas", "native")
NATIVE_FP4_MIN_CAPABILITY = (10, 0)  # Blackwell (sm_100) and newer
PALLAS_MIN_CAPABILITY = (8, 0)  # Triton's bf16 tensor-core dot


def compute_capability(device: jax.Device | None = None) -> tuple[int, int] | None:
  """(major, minor) of an NVIDIA GPU device, None for any other device."""
  device = device or jax.devices()[0]
  if device.platform != "gpu" or not hasattr(device, "compute_capability"):
    return None
  major, minor = str(device.compute_capability).split(".")
  return int(major), int(minor)


def has_native_fp4(device: jax.Device | None = None) -> bool:
  """Native block-scaled FP4 GEMM (NVFP4 / MXFP4 tcgen05 MMA) exists: compute capability >= 10.0."""
  cc = compute_capability(device)
  return cc is not None and cc >= NATIVE_FP4_MIN_CAPABILITY


def has_pallas_triton(device: jax.Device | None = None) -> bool:
  """The Pallas Triton kernels can run: an NVIDIA GPU of compute capability >= 8.0."""
  cc = compute_capability(device)
  return cc is not None and cc >= PALLAS_MIN_CAPABILITY


def pallas_interpret(device: jax.Device | None = None) -> bool:
  """Run Pallas kernels in interpret mode: the device is not a GPU (CPU CI; same jaxpr, same bits, slow)."""
  device = device or jax.devices()[0]
  return device.platform != "gpu"


def quantize_backend(shape: tuple[int, ...], axis_len_multiple: int, device: jax.Device | None = None) -> str:
  """"pallas" for a 2D tensor whose quantized axis is a whole number of blocks (and Hadamard chunks) on a GPU that
  runs the kernels, else "xla". ``axis_len_multiple`` is that unit, e.g. 16 for NVFP4 1x16, 128 for MS-EDEN."""
  ok_shape = len(shape) == 2 and shape[-1] % axis_len_multiple == 0
  return "pallas" if ok_shape and has_pallas_triton(device) else "xla"


def gemm_backend(k: int, block: int, device: jax.Device | None = None) -> str:
  """"native" on Blackwell and newer; "pallas" on other capable GPUs for K a whole number of blocks, whatever the
  rows (one row too: the Pallas GEMV beats XLA's dequantize + dot there, BENCHMARKS.md §5); "xla" (dequantize + dot)
  otherwise."""
  if k % block:
    return "xla"
  if has_native_fp4(device):
    return "native"
  if has_pallas_triton(device):
    return "pallas"
  return "xla"


def resolve(backend: str, auto: str) -> str:
  """``backend`` itself, or ``auto`` (the decision above) for ``"auto"``; a clear error for anything else."""
  if backend == "auto":
    return auto
  if backend not in BACKENDS:
    raise ValueError(f"backend must be 'auto' or one of {BACKENDS}, got {backend!r}")
  return backend
