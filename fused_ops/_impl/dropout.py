"""Fake kernels and autograd for dropout, dropout_, dropout_backward, bias_dropout_add and
bias_dropout_add_backward.

Nothing of x's size is saved for backward: the forward ops return a 2-element int64
seed_offset = {Philox seed, offset} and backward regenerates the mask from it.
The forward ops carry the `nondeterministic_seeded` tag (csrc/ops.cpp), so torch.compile
neither merges two calls nor recomputes one in backward.
"""
import torch
from torch._library.effects import EffectType

from ._grads import no_zero_grads

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
    return grad_out.new_empty(grad_out.shape)


@torch.library.register_fake("fused::bias_dropout_add")
def _bias_dropout_add_fake(x, bias, residual, p, training, *, generator=None):
    return x.new_empty(x.shape), _seed_offset_like(x)


@torch.library.register_fake("fused::bias_dropout_add_backward")
def _bias_dropout_add_backward_fake(grad_out, seed_offset, p):
    return grad_out.new_empty(grad_out.shape), grad_out.new_empty(grad_out.shape[-1:])


def _effective_p(p, training):
    # What backward must apply: nothing is dropped outside training.
    return p if training else 0.0


def _dropout_setup_context(ctx, inputs, keyword_only_inputs, output):
    _, p, training = inputs
    _, seed_offset = output
    no_zero_grads(ctx)
    ctx.p = _effective_p(p, training)
    ctx.save_for_backward(seed_offset)


def _dropout_backward(ctx, grad_y, _grad_seed_offset):
    if grad_y is None:
        return None, None, None
    (seed_offset,) = ctx.saved_tensors
    return ops.dropout_backward(grad_y, seed_offset, ctx.p), None, None


torch.library.register_autograd(
    "fused::dropout", _dropout_backward, setup_context=_dropout_setup_context
)


# dropout_backward is linear in grad_out with the same mask: its own backward is itself
# (double backward).
def _dropout_backward_setup_context(ctx, inputs, output):
    _, seed_offset, p = inputs
    ctx.p = p
    ctx.save_for_backward(seed_offset)


def _dropout_backward_backward(ctx, grad):
    (seed_offset,) = ctx.saved_tensors
    return ops.dropout_backward(grad, seed_offset, ctx.p), None, None


torch.library.register_autograd(
    "fused::dropout_backward", _dropout_backward_backward,
    setup_context=_dropout_backward_setup_context,
)


def _bias_dropout_add_setup_context(ctx, inputs, keyword_only_inputs, output):
    _, bias, _, p, training = inputs
    _, seed_offset = output
    no_zero_grads(ctx)
    ctx.p = _effective_p(p, training)
    ctx.has_bias = bias is not None
    ctx.save_for_backward(seed_offset)


def _bias_dropout_add_backward(ctx, grad_out, _grad_seed_offset):
    if grad_out is None:
        return None, None, None, None, None
    (seed_offset,) = ctx.saved_tensors
    grad_bias = None
    if ctx.has_bias and ctx.needs_input_grad[1]:
        grad_x, grad_bias = ops.bias_dropout_add_backward(grad_out, seed_offset, ctx.p)
    elif ctx.needs_input_grad[0]:
        grad_x = ops.dropout_backward(grad_out, seed_offset, ctx.p)
    else:
        grad_x = None
    # d out / d residual is the identity.
    return grad_x, grad_bias, grad_out, None, None


torch.library.register_autograd(
    "fused::bias_dropout_add", _bias_dropout_add_backward,
    setup_context=_bias_dropout_add_setup_context,
)
