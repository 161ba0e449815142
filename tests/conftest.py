import zlib

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
    # Fresh random inputs for every test, reproducible from the test's name (crc32, not
    # hash(): Python salts string hashes per process).
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield


@pytest.fixture
def knobs():
    """A test's kernel overrides (fused_ops.overrides): knobs("norm.fixed=0") applies a spec on
    top of the one in force for the rest of the test (a key given again takes its new value);
    the spec the test started with comes back after it."""
    base = fused_ops.overrides.current()

    def apply(spec):
        now = fused_ops.overrides.current()
        fused_ops.overrides.set_spec(f"{now},{spec}" if now and spec else now or spec)

    yield apply
    fused_ops.overrides.set_spec(base)
