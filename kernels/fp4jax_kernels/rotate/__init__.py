"""A backward GEMM's gradient out of the rotated domain (``fp4jax.operand.INVERSE_ROTATE_OP``): the Pallas Triton
kernel (``pallas_triton``) and its registered implementation with its limits (``api``)."""
