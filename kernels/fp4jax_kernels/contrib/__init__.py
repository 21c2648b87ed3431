"""Experimental kernels: measured (``benchmarks/kernels_gemm.py``, ``benchmarks/occ_bounds.py``), tested, and not
called by the library.

``fused_forward``: the forward GEMM with the activations rotated and quantized inside it (NVFP4 RTN).
``select_ranks``: per-row order statistics of bfloat16 rows, each row read once (OCC's clamp bounds). See
``README.md`` in this folder.
"""
