"""Experimental kernels: measured (``fp4jax_kernels.gemm.bench``), tested, and not called by the library.

``fused_forward``: the forward GEMM with the activations rotated and quantized inside it (NVFP4 RTN). See
``README.md`` in this folder.
"""
