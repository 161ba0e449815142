"""Fake kernels of the softmax ops (autograd: csrc/autograd/softmax.cpp). Outputs are
contiguous tensors of the input's shape, as the kernels (and torch's softmax) return them."""

import torch

from ._checks import check_same_device


def _check_dim(x, dim, op):
    n = max(x.dim(), 1)
    torch._check_index(
        -n <= dim < n,
        lambda: (
            f"{op}: Dimension out of range (expected to be "
            f"in range of [{-n}, {n - 1}], but got {dim})"
        ),
    )


@torch.library.register_fake("fused::softmax")
def _softmax_fake(x, dim=-1, *, scale=1.0, causal=False):
    _check_dim(x, dim, "fused::softmax")
    if causal:
        torch._check(
            x.dim() >= 2,
            lambda: (
                "fused::softmax: causal=True needs an input with "
                f"at least 2 dims (..., query, key), but got a {x.dim()}-d input"
            ),
        )
    return x.new_empty(x.shape)


@torch.library.register_fake("fused::log_softmax")
def _log_softmax_fake(x, dim=-1):
    _check_dim(x, dim, "fused::log_softmax")
    return x.new_empty(x.shape)


@torch.library.register_fake("fused::softmax_backward")
def _softmax_backward_fake(grad_out, y, dim=-1, *, scale=1.0, causal=False):
    check_same_device("fused::softmax_backward", y, grad_out=grad_out)
    return y.new_empty(y.shape)


@torch.library.register_fake("fused::log_softmax_backward")
def _log_softmax_backward_fake(grad_out, y, dim=-1):
    check_same_device("fused::log_softmax_backward", y, grad_out=grad_out)
    return y.new_empty(y.shape)
