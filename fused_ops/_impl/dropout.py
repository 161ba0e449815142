"""Fake kernels for dropout, dropout_, dropout_backward, bias_dropout_add and
bias_dropout_add_backward (autograd: csrc/autograd/dropout.cpp).

Nothing of x's size is saved for backward: the forward ops return a 2-element int64
seed_offset = {Philox seed, offset} and backward regenerates the mask from it.
The forward ops carry the `nondeterministic_seeded` tag (csrc/ops.cpp), so torch.compile
neither merges two calls nor recomputes one in backward.
"""

import torch
from torch._library.effects import EffectType

from ._checks import check_same_device

ops = torch.ops.fused

# Under torch.compile, AOTAutograd's common-subexpression pass exempts only a fixed list of
# aten random ops, not the nondeterministic_seeded tag: two dropout calls on the same input
# would be merged into one mask. Registering the random forward ops as ORDERED effects
# threads a token through every call, so no two are merged and they draw from the
# generator in program order, as in eager mode (tests/test_dropout.py::test_compile_fullgraph).
for _op in ("fused::dropout", "fused::dropout_", "fused::bias_dropout_add"):
    torch.library._register_effectful_op(_op, EffectType.ORDERED)


def _seed_offset_like(x):
    return x.new_empty(2, dtype=torch.int64)


@torch.library.register_fake("fused::dropout")
def _dropout_fake(x, p, training, *, generator=None):
    # Outputs are contiguous whatever x's layout (the kernels work in row-major order).
    return x.new_empty(x.shape), _seed_offset_like(x)


@torch.library.register_fake("fused::dropout_")
def _dropout__fake(x, p, training, *, generator=None):
    return _seed_offset_like(x)


@torch.library.register_fake("fused::dropout_backward")
def _dropout_backward_fake(grad_out, seed_offset, p):
    check_same_device("fused::dropout_backward", grad_out, seed_offset=seed_offset)
    return grad_out.new_empty(grad_out.shape)


@torch.library.register_fake("fused::bias_dropout_add")
def _bias_dropout_add_fake(x, bias, residual, p, training, *, generator=None):
    check_same_device("fused::bias_dropout_add", x, bias=bias, residual=residual)
    return x.new_empty(x.shape), _seed_offset_like(x)


@torch.library.register_fake("fused::bias_dropout_add_backward")
def _bias_dropout_add_backward_fake(grad_out, seed_offset, p):
    return grad_out.new_empty(grad_out.shape), grad_out.new_empty(grad_out.shape[-1:])
