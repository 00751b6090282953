import pytest
import torch
from helpers import seconds

# A test with no time limit of its own gets this one, so none can hang the suite.
DEFAULT_LIMIT_S = 300


@pytest.fixture(autouse=True)
def _restore_torch_globals():
    """Gears flip process-wide switches; give every test the defaults back."""
    benchmark = torch.backends.cudnn.benchmark
    precision = torch.get_float32_matmul_precision()
    yield
    torch.backends.cudnn.benchmark = benchmark
    torch.set_float32_matmul_precision(precision)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(seconds(DEFAULT_LIMIT_S)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
