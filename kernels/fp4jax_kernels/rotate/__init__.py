"""A backward gradient out of the rotated domain (``fp4jax._src.operand.INVERSE_ROTATE_OP``: quartet's dX and dW with
the trust mask): the one-pass Pallas Triton inverse Hadamard (``pallas_triton``) and its registered implementation
with its limits (``api``)."""
