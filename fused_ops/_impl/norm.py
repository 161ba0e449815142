"""Fake kernels and autograd for the norm ops: layer_norm, rms_norm, add_layer_norm,
add_rms_norm (and their *_backward ops). The kernels: csrc/cpu/norm.cpp, csrc/cuda/norm.cu.

Forward ops return y plus what the backward needs: mean (layer norm only) and rstd, float32
(float64 for float64 x) of shape x.shape[:-len(normalized_shape)]; the add forms also return
the sum s = x + residual, which is what gets normalized and what the backward reads.
Backward ops return dx (for the add forms: the gradient of s, which is also dx and
d_residual) and dweight / dbias, or an empty tensor for one not asked for.
"""
import torch

from ._grads import no_zero_grads

ops = torch.ops.fused


def _stat(x, normalized_shape):
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty(x.shape[: x.dim() - len(normalized_shape)], dtype=dtype)


def _sum_dtype(x, residual_in_fp32):
    return torch.float32 if residual_in_fp32 and x.dtype != torch.float64 else x.dtype


def _param_grad(wanted, param, grad_out, normalized_shape):
    if not wanted or param is None:
        return grad_out.new_empty((0,))
    return grad_out.new_empty(normalized_shape, dtype=param.dtype)


# ---- fake kernels -----------------------------------------------------------------------


@torch.library.register_fake("fused::layer_norm")
def _layer_norm_fake(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return x.new_empty(x.shape), _stat(x, normalized_shape), _stat(x, normalized_shape)


@torch.library.register_fake("fused::rms_norm")
def _rms_norm_fake(x, normalized_shape, weight=None, eps=None):
    return x.new_empty(x.shape), _stat(x, normalized_shape)


@torch.library.register_fake("fused::add_layer_norm")
def _add_layer_norm_fake(x, residual, normalized_shape, weight=None, bias=None, eps=1e-5,
                         residual_in_fp32=False):
    s = x.new_empty(x.shape, dtype=_sum_dtype(x, residual_in_fp32))
    return x.new_empty(x.shape), s, _stat(x, normalized_shape), _stat(x, normalized_shape)


@torch.library.register_fake("fused::add_rms_norm")
def _add_rms_norm_fake(x, residual, normalized_shape, weight=None, eps=None,
                       residual_in_fp32=False):
    s = x.new_empty(x.shape, dtype=_sum_dtype(x, residual_in_fp32))
    return x.new_empty(x.shape), s, _stat(x, normalized_shape)


@torch.library.register_fake("fused::layer_norm_backward")
def _layer_norm_backward_fake(grad_out, x, normalized_shape, mean, rstd, weight, bias,
                              output_mask):
    return (x.new_empty(x.shape),
            _param_grad(output_mask[0], weight, grad_out, normalized_shape),
            _param_grad(output_mask[1], bias, grad_out, normalized_shape))


@torch.library.register_fake("fused::rms_norm_backward")
def _rms_norm_backward_fake(grad_out, x, normalized_shape, rstd, weight, weight_grad):
    return x.new_empty(x.shape), _param_grad(weight_grad, weight, grad_out, normalized_shape)


@torch.library.register_fake("fused::add_layer_norm_backward")
def _add_layer_norm_backward_fake(grad_out, grad_sum, sum, normalized_shape, mean, rstd,
                                  weight, bias, output_mask):
    return (sum.new_empty(sum.shape),
            _param_grad(output_mask[0], weight, grad_out, normalized_shape),
            _param_grad(output_mask[1], bias, grad_out, normalized_shape))


@torch.library.register_fake("fused::add_rms_norm_backward")
def _add_rms_norm_backward_fake(grad_out, grad_sum, sum, normalized_shape, rstd, weight,
                                weight_grad):
    return sum.new_empty(sum.shape), _param_grad(weight_grad, weight, grad_out, normalized_shape)


# ---- autograd ---------------------------------------------------------------------------
# mean / rstd are outputs for the backward only: their incoming gradients are ignored, and
# arrive as None (no_zero_grads), as does dy or d_sum when that output was not used (the add
# forms with only the sum used pass d_sum straight through, without the norm's backward).


def _needs_grad(ctx, i):
    # The dispatcher drops trailing arguments equal to their defaults (weight=None, eps...),
    # which shortens ctx.needs_input_grad: a missing entry needs no gradient.
    return i < len(ctx.needs_input_grad) and bool(ctx.needs_input_grad[i])


def _layer_norm_setup(ctx, inputs, output):
    x, normalized_shape, weight, bias, _eps = inputs
    _, mean, rstd = output
    no_zero_grads(ctx)
    ctx.normalized_shape = normalized_shape
    ctx.save_for_backward(x, weight, bias, mean, rstd)


def _layer_norm_backward(ctx, dy, _dmean, _drstd):
    if dy is None:
        return None, None, None, None, None
    x, weight, bias, mean, rstd = ctx.saved_tensors
    mask = [_needs_grad(ctx, 2), _needs_grad(ctx, 3)]
    dx, dw, db = ops.layer_norm_backward(dy, x, ctx.normalized_shape, mean, rstd, weight, bias,
                                         mask)
    return dx, None, dw if mask[0] else None, db if mask[1] else None, None


torch.library.register_autograd("fused::layer_norm", _layer_norm_backward,
                                setup_context=_layer_norm_setup)


def _rms_norm_setup(ctx, inputs, output):
    x, normalized_shape, weight, _eps = inputs
    _, rstd = output
    no_zero_grads(ctx)
    ctx.normalized_shape = normalized_shape
    ctx.save_for_backward(x, weight, rstd)


def _rms_norm_backward(ctx, dy, _drstd):
    if dy is None:
        return None, None, None, None
    x, weight, rstd = ctx.saved_tensors
    want_dw = _needs_grad(ctx, 2)
    dx, dw = ops.rms_norm_backward(dy, x, ctx.normalized_shape, rstd, weight, want_dw)
    return dx, None, dw if want_dw else None, None


torch.library.register_autograd("fused::rms_norm", _rms_norm_backward,
                                setup_context=_rms_norm_setup)


def _add_setup(ctx, x, residual, normalized_shape):
    no_zero_grads(ctx)
    ctx.normalized_shape = normalized_shape
    ctx.x_dtype = x.dtype
    ctx.residual_dtype = residual.dtype


def _split_sum_grad(ctx, ds):
    # s = x + residual: both get ds, each in its own dtype.
    return ds.to(ctx.x_dtype), ds.to(ctx.residual_dtype)


def _add_layer_norm_setup(ctx, inputs, output):
    x, residual, normalized_shape, weight, bias, _eps, _in_fp32 = inputs
    _, s, mean, rstd = output
    _add_setup(ctx, x, residual, normalized_shape)
    ctx.save_for_backward(s, weight, bias, mean, rstd)


def _add_layer_norm_backward(ctx, dy, dsum, _dmean, _drstd):
    if dy is None:  # only the sum was used: its gradient passes straight through
        if dsum is None:
            return None, None, None, None, None, None, None
        return (*_split_sum_grad(ctx, dsum), None, None, None, None, None)
    s, weight, bias, mean, rstd = ctx.saved_tensors
    mask = [_needs_grad(ctx, 3), _needs_grad(ctx, 4)]
    ds, dw, db = ops.add_layer_norm_backward(dy, dsum, s, ctx.normalized_shape, mean, rstd,
                                             weight, bias, mask)
    dx, dres = _split_sum_grad(ctx, ds)
    return dx, dres, None, dw if mask[0] else None, db if mask[1] else None, None, None


torch.library.register_autograd("fused::add_layer_norm", _add_layer_norm_backward,
                                setup_context=_add_layer_norm_setup)


def _add_rms_norm_setup(ctx, inputs, output):
    x, residual, normalized_shape, weight, _eps, _in_fp32 = inputs
    _, s, rstd = output
    _add_setup(ctx, x, residual, normalized_shape)
    ctx.save_for_backward(s, weight, rstd)


def _add_rms_norm_backward(ctx, dy, dsum, _drstd):
    if dy is None:  # only the sum was used: its gradient passes straight through
        if dsum is None:
            return None, None, None, None, None, None
        return (*_split_sum_grad(ctx, dsum), None, None, None, None)
    s, weight, rstd = ctx.saved_tensors
    want_dw = _needs_grad(ctx, 3)
    ds, dw = ops.add_rms_norm_backward(dy, dsum, s, ctx.normalized_shape, rstd, weight,
                                       want_dw)
    dx, dres = _split_sum_grad(ctx, ds)
    return dx, dres, None, dw if want_dw else None, None, None


torch.library.register_autograd("fused::add_rms_norm", _add_rms_norm_backward,
                                setup_context=_add_rms_norm_setup)
