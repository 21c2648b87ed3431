"""Per-layer quantization error of the FP4 projections, sampled during training.

For every projection y = Q(x)·Q(W) whose dot is not flax's plain one, the error is measured against the
high-precision product of the same (bf16) operands, so each layer's number is isolated from upstream error:
  err_l = metric(x·W, y_l),   metric = fp4jax.metrics.relative_mse:  ‖x·W − y_l‖² / ‖x·W‖².
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from fp4jax.metrics import relative_mse
from fp4jax_experiments import model as model_lib

ERROR_NAME = "quant_error"


def projection_quant_errors(
  model: model_lib.Llama, params, tokens: jax.Array, key: jax.Array, metric: Callable = relative_mse
) -> dict:
  """{"block_<l>/<module path>": metric(x·W in fp32, quantized projection output)} for one forward pass.

  Layers with flax's plain dot (BF16 recipe, first/last BF16 blocks, embeddings, LM head) are not listed. Inside
  the scanned block stacks each projection sows its error per layer; layer i of a stack is block start + i.
  """

  def run(params, tokens, key):
    def interceptor(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      module = context.module
      if isinstance(module, nn.Dense) and context.method_name == "__call__" and module.dot_general_cls:
        x = args[0].astype(module.dtype)
        kernel = module.variables["params"]["kernel"].astype(module.dtype)
        reference = jnp.dot(x, kernel, preferred_element_type=jnp.float32)
        module.sow("intermediates", ERROR_NAME, metric(reference, out.astype(jnp.float32)))
      return out

    with nn.intercept_methods(interceptor):
      _, state = model.apply({"params": params}, tokens, rngs={"quant": key}, mutable=["intermediates"])
    return state.get("intermediates", {})

  starts = {stack.name: stack.start for stack in model_lib.layer_stacks(model.config)}
  errors = {}
  for path, per_layer in jax.tree_util.tree_leaves_with_path(jax.device_get(jax.jit(run)(params, tokens, key))):
    names = [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]
    stack, module_path = names[0], "/".join(names[1:-1])
    for i, err in enumerate(per_layer):
      errors[f"block_{starts[stack] + i}/{module_path}"] = float(err)
  return errors
