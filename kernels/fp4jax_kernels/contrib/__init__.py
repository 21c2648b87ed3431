"""Experimental kernels: measured (``benchmarks/``), tested, and not called by the library.

``fused_forward``: the forward GEMM with the activations rotated and quantized inside it (NVFP4 RTN).
``inverse_rotate``: a backward gradient out of the rotated domain in one pass
(``fp4jax._src.operand.INVERSE_ROTATE_OP``; ``inverse_rotate.register()`` opts in). See ``README.md`` here.
"""
