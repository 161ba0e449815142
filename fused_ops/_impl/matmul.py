"""Fake kernels for fused::matmul, fused::linear, fused::linear_fwd and
fused::linear_act_backward (autograd: csrc/autograd/matmul.cpp).

"""

import torch

from ._checks import check_same_device

ops = torch.ops.fused


def _matmul_out_shape(a, b):
    m, n = a.shape[-2], b.shape[-1]
    if a.dim() == 2 and b.dim() == 2:
        return (m, n)
    batch_a = a.shape[0] if a.dim() == 3 else 1
    batch_b = b.shape[0] if b.dim() == 3 else 1
    (batch,) = torch.broadcast_shapes((batch_a,), (batch_b,))
    return (batch, m, n)


@torch.library.register_fake("fused::matmul")
def _matmul_fake(a, b):
    check_same_device("fused::matmul", a, b=b)
    torch._check(a.dim() in (2, 3) and b.dim() in (2, 3), lambda: "expected 2-D or 3-D operands")
    torch._check(a.shape[-1] == b.shape[-2], lambda: "matmul: inner dimensions differ")
    return a.new_empty(_matmul_out_shape(a, b))


_GATED = ("swiglu", "geglu", "geglu_tanh")


def _linear_out_shape(x, weight, activation=None):
    """The output's shape: [..., out], or [..., out / 2] for a gated activation."""
    out = weight.shape[0]
    if activation in _GATED:
        torch._check(
            out % 2 == 0,
            lambda: f"a gated activation needs an even number of weight rows, got {out}",
        )
        out = out // 2
    return (*x.shape[:-1], out)


@torch.library.register_fake("fused::linear")
def _linear_fake(x, weight, bias=None, activation=None):
    check_same_device("fused::linear", x, weight=weight, bias=bias)
    return x.new_empty(_linear_out_shape(x, weight, activation))


@torch.library.register_fake("fused::linear_fwd")
def _linear_fwd_fake(x, weight, bias, activation):
    check_same_device("fused::linear_fwd", x, weight=weight, bias=bias)
    shape = _linear_out_shape(x, weight, activation)
    return x.new_empty(shape), x.new_empty(_linear_out_shape(x, weight))


@torch.library.register_fake("fused::linear_act_backward")
def _linear_act_backward_fake(grad_out, preact, activation, bias_grad):
    n = preact.shape[-1] if bias_grad else 0
    return preact.new_empty(preact.shape), preact.new_empty((n,))
