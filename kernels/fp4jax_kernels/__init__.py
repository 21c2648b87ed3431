"""Pallas kernels beneath fp4jax's quantizers and dot (import name ``fp4jax_kernels``; folder ``kernels/``)."""
