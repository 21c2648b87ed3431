"""The CPU half of ``tests/test_gpu_parity.py``'s property test, runnable anywhere: the harness compares a device
with itself (CPU vs CPU), so its inputs, configurations and comparisons are exercised without a GPU."""

import jax
import numpy as np
import pytest

from tests import test_gpu_parity as parity


def test_configs_cover_every_format_mode_rounding_and_axis():
  names = {name for name, _, _ in parity.parity_configs()}
  assert len(names) == 2 * (3 + 1 + 5 * 2)  # axes x (absmax rtn/sr/eden, four_over_six, MX modes x rtn/sr)
  assert {"nvfp4_absmax_eden_ax0", "nvfp4_four_over_six_rtn_ax-1", "mxfp4_floor_headroom_sr_ax0"} <= names


def test_inputs_hold_the_extreme_values():
  x = parity.parity_inputs(0, np.float32)["extreme"]
  assert np.isnan(x).any() and np.isinf(x).any() and (x == 0).any()
  finite = np.abs(x[np.isfinite(x)])
  assert finite.max() > 1e38 and ((finite > 0) & (finite < np.finfo(np.float32).tiny)).any()


@pytest.mark.parametrize(  # slow tier; default representative: [mxfp4_rceil_sr_ax-1] (inputs, key, every comparison)
  "name", [pytest.param("nvfp4_four_over_six_rtn_ax0", marks=pytest.mark.slow), "mxfp4_rceil_sr_ax-1"]
)
def test_harness_runs_on_cpu_against_itself(name):
  cpu = jax.devices("cpu")[0]
  configs = [c for c in parity.parity_configs() if c[0] == name]
  assert len(configs) == 1  # (an empty list would mean every config)
  parity.assert_parity(cpu, cpu, 0, np.float32, configs)
