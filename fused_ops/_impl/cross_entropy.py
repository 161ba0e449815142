"""Fake kernels of fused::cross_entropy and its family (autograd: csrc/autograd/cross_entropy.cpp),
and linear_cross_entropy's kernel (a chunk loop over the other fused ops).

The forward returns the per-row loss and the per-row logsumexp (lse); the backward needs no
reduction of its own: dlogits = g ((1 + 2 z lse) softmax(x) - eps / V - (1 - eps) onehot(t)),
with softmax(x) = exp(x - lse), reads the logits once and writes the gradient once.
With inplace_backward=True that gradient is written over the logits (their storage is
consumed: nothing may read them after the backward), which saves a [rows, V] buffer.
"""

import torch

from ._checks import check_same_device

ops = torch.ops.fused


def _row_dtype(logits):
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _check(logits, target, label_smoothing, op, **others):
    check_same_device(op, logits, target=target, **others)
    torch._check(
        logits.dim() >= 1,
        lambda: (
            f"{op}: expected logits of shape [..., V] with at least 1 dim, but got a 0-d tensor"
        ),
    )
    torch._check(
        logits.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64),
        lambda: (
            f"{op}: expected logits to be float32, float16, bfloat16 (or float64 "
            f"on CPU), but got {logits.dtype}"
        ),
    )
    torch._check(
        target.dtype in (torch.int64, torch.int32),
        lambda: (
            f"{op}: expected target to be int64 (or int32) class indices, but got {target.dtype}"
        ),
    )
    lead = tuple(logits.shape[:-1])
    rows = 1
    for s in lead:
        rows = rows * s
    torch._check(
        tuple(target.shape) == lead or (target.dim() == 1 and target.shape[0] == rows),
        lambda: (
            f"{op}: expected target of shape {list(lead)} (the logits' shape "
            f"without the class dim) or [{rows}], but got {list(target.shape)}"
        ),
    )
    torch._check(
        0.0 <= label_smoothing <= 1.0,
        lambda: f"{op}: expected label_smoothing in [0, 1], but got {label_smoothing}",
    )


@torch.library.register_fake("fused::cross_entropy")
def _cross_entropy_fake(
    logits,
    target,
    ignore_index=-100,
    label_smoothing=0.0,
    z_loss=0.0,
    inplace_backward=False,
    reduction="none",
):
    _check(logits, target, label_smoothing, "fused::cross_entropy")
    torch._check(
        reduction in ("none", "mean", "sum"),
        lambda: (
            "fused::cross_entropy: expected "
            f"reduction 'none', 'mean' or 'sum', but got '{reduction}'"
        ),
    )
    dt = _row_dtype(logits)
    loss_shape = target.shape if reduction == "none" else ()
    return (logits.new_empty(loss_shape, dtype=dt), logits.new_empty(target.shape, dtype=dt))


@torch.library.register_fake("fused::cross_entropy_backward")
def _cross_entropy_backward_fake(
    grad_loss, logits, target, lse, ignore_index, label_smoothing, z_loss, reduction="none"
):
    _check(
        logits,
        target,
        label_smoothing,
        "fused::cross_entropy_backward",
        grad_loss=grad_loss,
        lse=lse,
    )
    return logits.new_empty(logits.shape)


@torch.library.register_fake("fused::cross_entropy_backward_")
def _cross_entropy_backward_inplace_fake(
    grad_loss, logits, target, lse, ignore_index, label_smoothing, z_loss, reduction="none"
):
    _check(
        logits,
        target,
        label_smoothing,
        "fused::cross_entropy_backward_",
        grad_loss=grad_loss,
        lse=lse,
    )
    return None


# --- cross_entropy_with_grad: the gradient written by the forward ---------------------------
#
# For a 'mean' or 'sum' loss every row's loss gradient is the same scalar, so the forward
# kernel can write d loss / d logits (for a loss gradient of 1) while it has the row: the
# logits are read once (twice from the kernel, the second time from L2) and the gradient
# written once, against a read in the forward and a read + write in the backward. The
# backward scales that gradient in place by the loss's gradient; a gradient of exactly 1
# (loss.backward()) is detected on the device and moves no data.
#
# Any other loss gradient costs a full pass (read + write) in the backward, so this is the
# opt-in fused_ops.cross_entropy(..., precompute_grad=True), not the default. The saved
# gradient is scaled in place, so a second backward through the same graph
# (retain_graph=True) raises autograd's "modified by an inplace operation" error rather
# than scaling twice.


@torch.library.register_fake("fused::cross_entropy_with_grad")
def _cross_entropy_with_grad_fake(
    logits, target, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, mean=True
):
    _check(logits, target, label_smoothing, "fused::cross_entropy_with_grad")
    return logits.new_empty((), dtype=_row_dtype(logits)), logits.new_empty(logits.shape)


@torch.library.register_fake("fused::cross_entropy_scale_")
def _cross_entropy_scale_fake(grad, scale):
    check_same_device("fused::cross_entropy_scale_", grad, scale=scale)
    return None


# --- linear_cross_entropy -------------------------------------------------------------------
#
# The LM head and the loss in chunks of tokens, so the [tokens, V] logits never exist in
# full: the kernel (CPU and CUDA) is csrc/cpu/linear_cross_entropy.cpp, a loop over the other
# fused ops; its checks are mirrored here for the fake kernel.


def _lce_check(hidden, weight, target, bias, op):
    torch._check(
        weight.dim() == 2,
        lambda: f"{op}: expected weight of shape [V, H], but got {list(weight.shape)}",
    )
    torch._check(
        hidden.dim() >= 1 and hidden.shape[-1] == weight.shape[1],
        lambda: (
            f"{op}: expected hidden of shape [..., {weight.shape[1]}] (weight is "
            f"{list(weight.shape)}), but got {list(hidden.shape)}"
        ),
    )
    torch._check(
        hidden.dtype == weight.dtype,
        lambda: (
            f"{op}: expected hidden and weight of "
            f"the same dtype, but got {hidden.dtype} and {weight.dtype}"
        ),
    )
    check_same_device(op, hidden, weight=weight, target=target, bias=bias)
    if bias is not None:
        torch._check(
            tuple(bias.shape) == (weight.shape[0],) and bias.dtype == weight.dtype,
            lambda: (
                f"{op}: expected bias of shape [{weight.shape[0]}] and dtype "
                f"{weight.dtype}, but got {list(bias.shape)} {bias.dtype}"
            ),
        )
    torch._check(
        target.dtype in (torch.int64, torch.int32),
        lambda: (
            f"{op}: expected target to be int64 (or int32) class indices, but got {target.dtype}"
        ),
    )
    rows = hidden.numel() // max(hidden.shape[-1], 1) if hidden.shape[-1] else 0
    lead = tuple(hidden.shape[:-1])
    torch._check(
        tuple(target.shape) == lead or (target.dim() == 1 and target.numel() == rows),
        lambda: (
            f"{op}: expected target of shape {list(lead)} or [{rows}], but got {list(target.shape)}"
        ),
    )


def _lce_outputs(hidden, weight, bias, grad_mask, row_dtype):
    empty = hidden.new_empty((0,))
    return (
        hidden.new_empty((), dtype=row_dtype),
        hidden.new_empty(hidden.shape) if grad_mask[0] else empty,
        weight.new_empty(weight.shape) if grad_mask[1] else empty,
        bias.new_empty(bias.shape) if (grad_mask[2] and bias is not None) else empty,
    )


@torch.library.register_fake("fused::linear_cross_entropy")
def _linear_cross_entropy_fake(
    hidden,
    weight,
    target,
    bias=None,
    ignore_index=-100,
    label_smoothing=0.0,
    z_loss=0.0,
    mean=True,
    chunk_size=0,
    grad_mask=(False, False, False),
):
    _lce_check(hidden, weight, target, bias, "fused::linear_cross_entropy")
    return _lce_outputs(hidden, weight, bias, grad_mask, _row_dtype(hidden))
