"""Fake kernels for fused::mlp and fused::linear_dact (autograd: csrc/autograd/mlp.cpp)."""

import torch

from ._checks import check_same_device

_GATED = ("swiglu", "geglu", "geglu_tanh")


@torch.library.register_fake("fused::mlp")
def _mlp_fake(x, w1, b1, w2, b2, activation="gelu", recompute=False):
    check_same_device("fused::mlp", x, w1=w1, b1=b1, w2=w2, b2=b2)
    hidden = w1.shape[0] // 2 if activation in _GATED else w1.shape[0]
    torch._check(
        w2.shape[1] == hidden,
        lambda: f"fused::mlp: w2.size(1) = {w2.shape[1]} must equal the hidden width {hidden}",
    )
    return x.new_empty((*x.shape[:-1], w2.shape[0]))


@torch.library.register_fake("fused::linear_dact")
def _linear_dact_fake(grad_out, weight, preact, activation, bias_grad):
    check_same_device("fused::linear_dact", grad_out, weight=weight, preact=preact)
    n = preact.shape[-1] if bias_grad else 0
    return preact.new_empty(preact.shape), preact.new_empty((n,))
