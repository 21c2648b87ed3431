"""An experimental kernel: measured (``benchmarks/``), tested, and not called by the library.

``fused_forward``: the forward GEMM with the activations rotated and quantized inside it (NVFP4 RTN). See
``README.md`` here.
"""
