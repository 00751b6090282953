import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_torch_globals():
    """Gears flip process-wide switches; give every test the defaults back."""
    benchmark = torch.backends.cudnn.benchmark
    precision = torch.get_float32_matmul_precision()
    yield
    torch.backends.cudnn.benchmark = benchmark
    torch.set_float32_matmul_precision(precision)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
