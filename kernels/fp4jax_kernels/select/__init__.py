"""Per-row order statistics (``fp4jax.estimators.SELECT_OP``, Microsoft FP4's OCC clamp bounds): the Pallas Triton
select of bfloat16 rows (``pallas_triton``) and its registered implementation with its limits (``api``)."""
