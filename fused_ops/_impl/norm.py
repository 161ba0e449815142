"""Fake kernels for the norm ops: layer_norm, rms_norm, add_layer_norm,
add_rms_norm (and their *_backward ops). The kernels: csrc/cpu/norm.cpp, csrc/cuda/norm.cu.

Forward ops return y plus what the backward needs: mean (layer norm only) and rstd, float32
(float64 for float64 x) of shape x.shape[:-len(normalized_shape)]; the add forms also return
the sum s = x + residual, which is what gets normalized and what the backward reads.
Backward ops return dx (for the add forms: the gradient of s, which is also dx and
d_residual) and dweight / dbias, or an empty tensor for one not asked for.
Autograd is in C++: csrc/autograd/norm.cpp.
"""

import torch
from torch._library.effects import EffectType

from ._checks import check_same_device

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
    check_same_device("fused::layer_norm", x, weight=weight, bias=bias)
    return x.new_empty(x.shape), _stat(x, normalized_shape), _stat(x, normalized_shape)


@torch.library.register_fake("fused::rms_norm")
def _rms_norm_fake(x, normalized_shape, weight=None, eps=None):
    check_same_device("fused::rms_norm", x, weight=weight)
    return x.new_empty(x.shape), _stat(x, normalized_shape)


@torch.library.register_fake("fused::add_layer_norm")
def _add_layer_norm_fake(
    x, residual, normalized_shape, weight=None, bias=None, eps=1e-5, residual_in_fp32=False
):
    check_same_device("fused::add_layer_norm", x, residual=residual, weight=weight, bias=bias)
    s = x.new_empty(x.shape, dtype=_sum_dtype(x, residual_in_fp32))
    return x.new_empty(x.shape), s, _stat(x, normalized_shape), _stat(x, normalized_shape)


@torch.library.register_fake("fused::add_rms_norm")
def _add_rms_norm_fake(
    x, residual, normalized_shape, weight=None, eps=None, residual_in_fp32=False
):
    check_same_device("fused::add_rms_norm", x, residual=residual, weight=weight)
    s = x.new_empty(x.shape, dtype=_sum_dtype(x, residual_in_fp32))
    return x.new_empty(x.shape), s, _stat(x, normalized_shape)


@torch.library.register_fake("fused::layer_norm_backward")
def _layer_norm_backward_fake(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    check_same_device(
        "fused::layer_norm_backward",
        x,
        grad_out=grad_out,
        mean=mean,
        rstd=rstd,
        weight=weight,
        bias=bias,
    )
    return (
        x.new_empty(x.shape),
        _param_grad(output_mask[0], weight, grad_out, normalized_shape),
        _param_grad(output_mask[1], bias, grad_out, normalized_shape),
    )


@torch.library.register_fake("fused::rms_norm_backward")
def _rms_norm_backward_fake(grad_out, x, normalized_shape, rstd, weight, weight_grad):
    check_same_device("fused::rms_norm_backward", x, grad_out=grad_out, rstd=rstd, weight=weight)
    return x.new_empty(x.shape), _param_grad(weight_grad, weight, grad_out, normalized_shape)


@torch.library.register_fake("fused::add_layer_norm_backward")
def _add_layer_norm_backward_fake(
    grad_out, grad_sum, sum, normalized_shape, mean, rstd, weight, bias, output_mask
):
    check_same_device(
        "fused::add_layer_norm_backward",
        sum,
        grad_out=grad_out,
        grad_sum=grad_sum,
        mean=mean,
        rstd=rstd,
        weight=weight,
        bias=bias,
    )
    return (
        sum.new_empty(sum.shape),
        _param_grad(output_mask[0], weight, grad_out, normalized_shape),
        _param_grad(output_mask[1], bias, grad_out, normalized_shape),
    )


@torch.library.register_fake("fused::add_rms_norm_backward")
def _add_rms_norm_backward_fake(
    grad_out, grad_sum, sum, normalized_shape, rstd, weight, weight_grad
):
    check_same_device(
        "fused::add_rms_norm_backward",
        sum,
        grad_out=grad_out,
        grad_sum=grad_sum,
        rstd=rstd,
        weight=weight,
    )
    return sum.new_empty(sum.shape), _param_grad(weight_grad, weight, grad_out, normalized_shape)


# ---- the dropout forms ------------------------------------------------------------------
# Random like fused::dropout: ORDERED effects keep torch.compile from merging two calls
# (see _impl/dropout.py).
for _op in ("fused::dropout_add_layer_norm", "fused::dropout_add_rms_norm"):
    torch.library._register_effectful_op(_op, EffectType.ORDERED)


# The keyword-only arguments (p, training, input_bias, residual_in_fp32, generator) as kw.
def _dropout_add_outputs(op, x, residual, normalized_shape, params, kw, layer):
    check_same_device(op, x, residual=residual, input_bias=kw.get("input_bias"), **params)
    s = x.new_empty(x.shape, dtype=_sum_dtype(x, kw.get("residual_in_fp32", False)))
    stats = (_stat(x, normalized_shape),) * (2 if layer else 1)
    return (x.new_empty(x.shape), s, *(t.clone() for t in stats), _seed_offset(x))


@torch.library.register_fake("fused::dropout_add_layer_norm")
def _dropout_add_layer_norm_fake(
    x, residual, normalized_shape, weight=None, bias=None, eps=1e-5, **kw
):
    params = {"weight": weight, "bias": bias}
    op = "fused::dropout_add_layer_norm"
    return _dropout_add_outputs(op, x, residual, normalized_shape, params, kw, True)


@torch.library.register_fake("fused::dropout_add_rms_norm")
def _dropout_add_rms_norm_fake(x, residual, normalized_shape, weight=None, eps=None, **kw):
    op = "fused::dropout_add_rms_norm"
    return _dropout_add_outputs(op, x, residual, normalized_shape, {"weight": weight}, kw, False)


def _seed_offset(x):
    return x.new_empty(2, dtype=torch.int64)
