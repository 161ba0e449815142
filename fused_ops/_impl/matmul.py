"""Fake kernels and autograd for fused::matmul, fused::linear and fused::linear_fwd.

Backward of y = act(x W^T + b), with z = x W^T + b the pre-activation:
  dZ = dY * act'(Z)          fused::linear_act_backward (one pass; also the bias gradient,
                             column sums of dZ added in a fixed order: deterministic)
  dX = dZ W                  fused::matmul (W read in place)
  dW = dZ^T X                fused::matmul (dZ^T is a transposed view, read in place)
fused::linear_fwd returns z next to y so training does not recompute it; fused::linear (the
inference op) recomputes z in its backward when it has an activation.
"""
import torch

from ._grads import no_zero_grads

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
    torch._check(a.dim() in (2, 3) and b.dim() in (2, 3), lambda: "expected 2-D or 3-D operands")
    torch._check(a.shape[-1] == b.shape[-2], lambda: "matmul: inner dimensions differ")
    return a.new_empty(_matmul_out_shape(a, b))


def _sum_to(grad, shape):
    """Sum a batched gradient over the batch dimensions its operand broadcast."""
    if tuple(grad.shape) == tuple(shape):
        return grad
    if len(shape) == 2:
        return grad.sum(0)
    return grad.sum(0, keepdim=True)


def _matmul_setup_context(ctx, inputs, output):
    a, b = inputs
    ctx.save_for_backward(a, b)


def _matmul_backward(ctx, grad):
    a, b = ctx.saved_tensors
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = _sum_to(ops.matmul(grad, b.transpose(-1, -2)), a.shape)
    if ctx.needs_input_grad[1]:
        if a.dim() == 3 and b.dim() == 2:
            # One GEMM over all rows instead of a batch then a sum.
            grad_b = ops.matmul(a.reshape(-1, a.shape[-1]).t(), grad.reshape(-1, grad.shape[-1]))
        else:
            grad_b = _sum_to(ops.matmul(a.transpose(-1, -2), grad), b.shape)
    return grad_a, grad_b


torch.library.register_autograd(
    "fused::matmul", _matmul_backward, setup_context=_matmul_setup_context
)


def _linear_out_shape(x, weight):
    return (*x.shape[:-1], weight.shape[0])


@torch.library.register_fake("fused::linear")
def _linear_fake(x, weight, bias=None, activation=None):
    return x.new_empty(_linear_out_shape(x, weight))


@torch.library.register_fake("fused::linear_fwd")
def _linear_fwd_fake(x, weight, bias, activation):
    shape = _linear_out_shape(x, weight)
    return x.new_empty(shape), x.new_empty(shape)


@torch.library.register_fake("fused::linear_act_backward")
def _linear_act_backward_fake(grad_out, preact, activation, bias_grad):
    n = preact.shape[-1] if bias_grad else 0
    return preact.new_empty(preact.shape), preact.new_empty((n,))


def _linear_input_grads(ctx, dz, x, weight, bias, bias_grad):
    """(dX, dW, dbias) from dZ; dbias is passed in (None when not needed)."""
    n, k = weight.shape
    dz2 = dz.reshape(-1, n)
    grad_x = grad_w = None
    if ctx.needs_input_grad[0]:
        grad_x = ops.matmul(dz2, weight).reshape(x.shape)
    if ctx.needs_input_grad[1]:
        grad_w = ops.matmul(dz2.t(), x.reshape(-1, k))
    return grad_x, grad_w, bias_grad


def _dz_and_bias_grad(ctx, grad_y, preact, bias, activation):
    need_bias = bias is not None and ctx.needs_input_grad[2]
    if activation is None:
        n = grad_y.shape[-1]
        bias_grad = None
        if need_bias:
            bias_grad = grad_y.reshape(-1, n).sum(0, dtype=torch.float32).to(grad_y.dtype)
        return grad_y, bias_grad
    dz, bias_grad = ops.linear_act_backward(grad_y, preact, activation, need_bias)
    return dz, (bias_grad if need_bias else None)


def _linear_setup_context(ctx, inputs, output):
    x, weight, bias, activation = inputs
    ctx.activation = activation
    ctx.save_for_backward(x, weight, bias)


def _linear_backward(ctx, grad_y):
    x, weight, bias = ctx.saved_tensors
    preact = None
    if ctx.activation is not None:
        # The inference op did not keep the pre-activation: recompute it.
        _, preact = ops.linear_fwd(x, weight, bias, ctx.activation)
    dz, bias_grad = _dz_and_bias_grad(ctx, grad_y, preact, bias, ctx.activation)
    return (*_linear_input_grads(ctx, dz, x, weight, bias, bias_grad), None)


torch.library.register_autograd(
    "fused::linear", _linear_backward, setup_context=_linear_setup_context
)


def _linear_fwd_setup_context(ctx, inputs, output):
    x, weight, bias, activation = inputs
    _, preact = output
    ctx.activation = activation
    ctx.mark_non_differentiable(preact)
    no_zero_grads(ctx)
    ctx.save_for_backward(x, weight, bias, preact)


def _linear_fwd_backward(ctx, grad_y, _grad_preact):
    if grad_y is None:
        return None, None, None, None
    x, weight, bias, preact = ctx.saved_tensors
    dz, bias_grad = _dz_and_bias_grad(ctx, grad_y, preact, bias, ctx.activation)
    return (*_linear_input_grads(ctx, dz, x, weight, bias, bias_grad), None)


torch.library.register_autograd(
    "fused::linear_fwd", _linear_fwd_backward, setup_context=_linear_fwd_setup_context
)
