"""Per-case compile and run time of the jitted quantizers on the default device (diagnoses slow GPU compiles)."""

import sys
import time

import jax
import numpy as np

sys.path.insert(0, "tests")
from test_gpu_parity import CASES, _inputs  # noqa: E402

import fp4jax  # noqa: E402

print(jax.__version__, jax.devices(), flush=True)
for name, kw in sorted(CASES.items()):
  kw = dict(kw)
  fmt = kw.pop("fmt")
  x = _inputs(np.float32)
  t = time.time()
  f = jax.jit(lambda a, k: fp4jax.quantize(a, fmt, key=k, **kw))
  lowered = f.lower(x, jax.random.key(3))
  t1 = time.time()
  compiled = lowered.compile()
  t2 = time.time()
  jax.block_until_ready(compiled(x, jax.random.key(3)))
  print(f"{name:22s} lower {t1 - t:6.2f}s compile {t2 - t1:6.2f}s run {time.time() - t2:6.2f}s", flush=True)
