"""The package itself: import-time torch version check, registration, build flags."""

import os
import subprocess
import sys

import pytest
import torch

import fused_ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_refuses_another_torch_version():
    code = "import torch; torch.__version__ = '0.0.1'; import fused_ops"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "built against torch" in last and "0.0.1" in last
    assert "pip install --no-build-isolation" in last


def test_build_info_matches_running_torch():
    from fused_ops import _build_info

    assert _build_info.TORCH_VERSION == torch.__version__
    assert fused_ops.WITH_CUDA == _build_info.WITH_CUDA


def test_ops_are_registered_with_the_dispatcher():
    for name in ["gelu", "gelu_backward"]:
        op = getattr(torch.ops.fused, name)
        assert op.default._schema.name == f"fused::{name}"


def test_functional_api_mirrors_torch_signatures():
    import inspect

    import torch.nn.functional as F

    for name in fused_ops.functional.__all__:
        try:
            theirs = list(inspect.signature(getattr(F, name)).parameters)
        except (AttributeError, ValueError):  # not in F, or a builtin without a signature
            continue
        ours = list(inspect.signature(getattr(fused_ops, name)).parameters)
        assert ours[: len(theirs)] == theirs[: len(ours)], name


@pytest.mark.cuda
def test_cuda_kernels_are_built_where_a_gpu_is():
    assert fused_ops.WITH_CUDA
