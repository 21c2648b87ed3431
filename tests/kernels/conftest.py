import jax
import pytest

ON_GPU = jax.default_backend() == "gpu"


@pytest.fixture(scope="session")
def interpret():
  """Kernels run compiled on a GPU, in Pallas interpret mode elsewhere (CI's CPUs)."""
  return not ON_GPU
