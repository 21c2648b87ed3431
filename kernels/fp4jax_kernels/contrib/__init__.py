"""Experimental kernels: measured (``benchmarks/kernels_gemm.py``), tested, and not called by the library.

``fused_forward``: the forward GEMM with the activations rotated and quantized inside it (NVFP4 RTN). See
``README.md`` in this folder.
"""
