"""Fake kernels of fused::gelu and fused::gelu_backward (autograd: csrc/autograd/gelu.cpp).

Outputs keep the input's layout as torch's elementwise ops do: empty_like of a dense input
has its strides, of any other its dims' order (csrc/common/layout.h does the same)."""

import torch

from ._checks import check_same_device


@torch.library.register_fake("fused::gelu")
def _gelu_fake(x, *, approximate="none"):
    return torch.empty_like(x)


@torch.library.register_fake("fused::gelu_backward")
def _gelu_backward_fake(grad_out, x, *, approximate="none"):
    check_same_device("fused::gelu_backward", x, grad_out=grad_out)
    return torch.empty_like(x)
