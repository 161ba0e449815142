import pytest
import torch

import fused_ops  # noqa: F401  (registers torch.ops.fused)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    # Fresh random inputs for every test, but reproducible from the test's name.
    torch.manual_seed(hash(request.node.nodeid) % (2**31))
    yield
