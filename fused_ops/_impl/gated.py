"""Fake kernels of fused::swiglu, fused::geglu and their backward ops (autograd:
csrc/autograd/gated.cpp). Outputs are contiguous, of gate's shape, as the kernels give."""

import torch

from ._checks import check_same_device


def _check(op, gate, up, grad_out=None):
    check_same_device(op, gate, up=up, grad_out=grad_out)
    torch._check(gate.shape == up.shape, lambda: f"{op}: expected gate and up of the same shape")
    torch._check(gate.dtype == up.dtype, lambda: f"{op}: expected gate and up of the same dtype")


@torch.library.register_fake("fused::swiglu")
def _swiglu_fake(gate, up):
    _check("fused::swiglu", gate, up)
    return gate.new_empty(gate.shape)


@torch.library.register_fake("fused::geglu")
def _geglu_fake(gate, up, *, approximate="none"):
    _check("fused::geglu", gate, up)
    return gate.new_empty(gate.shape)


@torch.library.register_fake("fused::swiglu_backward")
def _swiglu_backward_fake(grad_out, gate, up):
    _check("fused::swiglu_backward", gate, up, grad_out)
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


@torch.library.register_fake("fused::geglu_backward")
def _geglu_backward_fake(grad_out, gate, up, *, approximate="none"):
    _check("fused::geglu_backward", gate, up, grad_out)
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)
