"""fp4jax under ``jax_enable_x64``: the same bits as without it, and no crash.

With x64 on, a Python int next to another Python int becomes an int64 array (``jnp.where(c, 8, 0)``), and XLA's CPU
compiler segfaulted on the int32 | int64 bit operations this produced in eager ``fake_quantize`` and
``dot_general``. The x64 run happens in a subprocess, so a segfault fails this test instead of killing pytest.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax

# slow tier; default representative: test_public_variants.py's test_eager_quantize_and_dot_general_under_x64_*
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = ("nvidia_nvfp4",)  # 2D weight tiles, SR and a 16-point RHT in its backward
DN = (((1,), (1,)), ((), ()))


def compute(dtype_name: str) -> dict:
  """Eager fake_quantize (NVFP4, MXFP4; rtn, sr), quantize, dot_general forward (both recipes) and gradients
  (nvidia_nvfp4), as NumPy arrays."""
  rng = np.random.RandomState(0)
  dtype = jnp.dtype(dtype_name)
  x = jnp.asarray(rng.standard_t(3, (64, 128)).astype(np.float32), dtype)
  w = jnp.asarray(rng.standard_t(3, (32, 128)).astype(np.float32), dtype)
  key = jax.random.key(7)
  out = {}
  for fmt in (fp4jax.NVFP4, fp4jax.MXFP4):
    for rounding in ("rtn", "sr"):
      out[f"fq_{fmt.name}_{rounding}"] = fp4jax.fake_quantize(x, fmt, rounding=rounding, key=key)
    q = fp4jax.quantize(x, fmt, rounding="sr", key=key)
    out[f"q_{fmt.name}"] = jnp.concatenate(
      [q.codes.ravel().astype(jnp.float32), q.scale_values().ravel(), q.global_scale.ravel()]
    )
  for recipe in RECIPES:
    f = lambda a, b, recipe=recipe: fp4jax.dot_general(a, b, DN, recipe=recipe, key=key)
    out[f"dot_{recipe}"] = f(x, w)
  # the eager backward too (op by op; the MXFP4 quantizers run eagerly above)
  loss = lambda a, b: jnp.sum(fp4jax.dot_general(a, b, DN, recipe=RECIPES[0], key=key).astype(jnp.float32) ** 2)
  for i, g in enumerate(jax.grad(loss, argnums=(0, 1))(x, w)):
    out[f"grad{i}_{RECIPES[0]}"] = g
  return {k: np.asarray(v) for k, v in out.items()}


DTYPES = ("float32", "float64")


@pytest.fixture(scope="module")
def x64_results(tmp_path_factory):
  """``{dtype_name: {name: array}}``: ``compute`` of each input dtype in one subprocess with x64 on (one interpreter
  start and one JAX import for both dtypes)."""
  folder = tmp_path_factory.mktemp("x64")
  script = textwrap.dedent(f"""
      import jax
      jax.config.update("jax_enable_x64", True)
      import numpy as np
      from tests.test_x64 import compute
      for dtype_name in {DTYPES!r}:
        np.savez({str(folder)!r} + f"/{{dtype_name}}.npz", **compute(dtype_name))
  """)
  env = dict(
    os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "kernels"), os.environ.get("PYTHONPATH", "")])
  )
  run = subprocess.run(
    [sys.executable, "-c", script], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200
  )
  assert run.returncode == 0, f"x64 subprocess failed (rc {run.returncode}):\n{run.stderr[-3000:]}"
  return {name: dict(np.load(folder / f"{name}.npz")) for name in DTYPES}


@pytest.fixture(scope="module")
def x32_results():
  """``compute("float32")`` in this process (x64 off), computed once for both dtypes' comparisons."""
  return compute("float32")


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_x64_gives_the_same_bits_as_x32(dtype_name, x64_results, x32_results):
  got = x64_results[dtype_name]
  # without x64 float64 is float32: the same computation as the x64 run on float32 inputs
  expect = x32_results
  assert sorted(got) == sorted(expect)
  for name, value in expect.items():
    g = got[name]
    if dtype_name == "float64" and g.dtype == np.float64:
      g = g.astype(np.float32)  # a float64 input's outputs are float64: they hold float32 values
    np.testing.assert_array_equal(g.view(np.uint8), value.view(np.uint8), err_msg=name)
