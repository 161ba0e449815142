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
    torch._check(logits.dim() >= 1, lambda: f"{op}: expected logits of shape [..., V] with at "
                 "least 1 dim, but got a 0-d tensor")
    torch._check(logits.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64),
                 lambda: f"{op}: expected logits to be float32, float16, bfloat16 (or float64 "
                 f"on CPU), but got {logits.dtype}")
    torch._check(target.dtype in (torch.int64, torch.int32),
                 lambda: f"{op}: expected target to be int64 (or int32) class indices, but got "
                 f"{target.dtype}")
    lead = tuple(logits.shape[:-1])
    rows = 1
    for s in lead:
        rows = rows * s
    torch._check(tuple(target.shape) == lead or (target.dim() == 1 and target.shape[0] == rows),
                 lambda: f"{op}: expected target of shape {list(lead)} (the logits' shape "
                 f"without the class dim) or [{rows}], but got {list(target.shape)}")
    torch._check(0.0 <= label_smoothing <= 1.0, lambda: f"{op}: expected label_smoothing in "
                 f"[0, 1], but got {label_smoothing}")


@torch.library.register_fake("fused::cross_entropy")
def _cross_entropy_fake(logits, target, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                        inplace_backward=False, reduction="none"):
    _check(logits, target, label_smoothing, "fused::cross_entropy")
    torch._check(reduction in ("none", "mean", "sum"), lambda: "fused::cross_entropy: expected "
                 f"reduction 'none', 'mean' or 'sum', but got '{reduction}'")
    dt = _row_dtype(logits)
    loss_shape = target.shape if reduction == "none" else ()
    return (logits.new_empty(loss_shape, dtype=dt), logits.new_empty(target.shape, dtype=dt))


@torch.library.register_fake("fused::cross_entropy_backward")
def _cross_entropy_backward_fake(grad_loss, logits, target, lse, ignore_index, label_smoothing,
                                 z_loss, reduction="none"):
    _check(logits, target, label_smoothing, "fused::cross_entropy_backward", grad_loss=grad_loss,
           lse=lse)
    return logits.new_empty(logits.shape)


@torch.library.register_fake("fused::cross_entropy_backward_")
def _cross_entropy_backward_inplace_fake(grad_loss, logits, target, lse, ignore_index,
                                         label_smoothing, z_loss, reduction="none"):
    _check(logits, target, label_smoothing, "fused::cross_entropy_backward_",
           grad_loss=grad_loss, lse=lse)
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
def _cross_entropy_with_grad_fake(logits, target, ignore_index=-100, label_smoothing=0.0,
                                  z_loss=0.0, mean=True):
    _check(logits, target, label_smoothing, "fused::cross_entropy_with_grad")
    return logits.new_empty((), dtype=_row_dtype(logits)), logits.new_empty(logits.shape)


@torch.library.register_fake("fused::cross_entropy_scale_")
def _cross_entropy_scale_fake(grad, scale):
    check_same_device("fused::cross_entropy_scale_", grad, scale=scale)
    return None


# --- linear_cross_entropy -------------------------------------------------------------------
#
# The LM head and the loss in chunks of tokens, so the [tokens, V] logits never exist in
# full. Per chunk of c tokens (h: [c, H]):
#     logits = linear(h, W, b)                    fused::linear          [c, V]
#     loss, lse = cross_entropy(logits, t)        fused::cross_entropy   one read of logits
#     dlogits = over the logits, in place         fused::cross_entropy_backward_
#     grad_h[chunk] = dlogits @ W                 fused::matmul
#     grad_W += dlogits^T @ h                     torch.addmm_ (cuBLAS: beta = 1 accumulates
#                                                 in place; the fused GEMM has no accumulate)
#     grad_b += dlogits summed over the chunk
# The gradients are computed in the forward, for a loss gradient of 1 (the loss is a 'mean'
# or 'sum', so the gradient reaching it is one scalar); the backward scales them by that
# scalar. Only a chunk's logits are alive at a time: peak memory is grad_W plus one chunk.
# The weight gradient is accumulated in the weight's dtype (as the weight's .grad would be);
# each chunk's product is accumulated in float32 inside the GEMM.

# Tokens per chunk: the weight-gradient GEMM has K = chunk, and below ~1024 it is bound by
# reading and writing grad_W (V x H) once per chunk rather than by its FLOPs.
DEFAULT_CHUNK = 1024


def _lce_check(hidden, weight, target, bias, op):
    torch._check(weight.dim() == 2, lambda: f"{op}: expected weight of shape [V, H], but got "
                 f"{list(weight.shape)}")
    torch._check(hidden.dim() >= 1 and hidden.shape[-1] == weight.shape[1],
                 lambda: f"{op}: expected hidden of shape [..., {weight.shape[1]}] (weight is "
                 f"{list(weight.shape)}), but got {list(hidden.shape)}")
    torch._check(hidden.dtype == weight.dtype, lambda: f"{op}: expected hidden and weight of "
                 f"the same dtype, but got {hidden.dtype} and {weight.dtype}")
    check_same_device(op, hidden, weight=weight, target=target, bias=bias)
    if bias is not None:
        torch._check(tuple(bias.shape) == (weight.shape[0],) and bias.dtype == weight.dtype,
                     lambda: f"{op}: expected bias of shape [{weight.shape[0]}] and dtype "
                     f"{weight.dtype}, but got {list(bias.shape)} {bias.dtype}")
    torch._check(target.dtype in (torch.int64, torch.int32),
                 lambda: f"{op}: expected target to be int64 (or int32) class indices, but got "
                 f"{target.dtype}")
    rows = hidden.numel() // max(hidden.shape[-1], 1) if hidden.shape[-1] else 0
    lead = tuple(hidden.shape[:-1])
    torch._check(tuple(target.shape) == lead or (target.dim() == 1 and target.numel() == rows),
                 lambda: f"{op}: expected target of shape {list(lead)} or [{rows}], but got "
                 f"{list(target.shape)}")


def _lce_outputs(hidden, weight, bias, grad_mask, row_dtype):
    empty = hidden.new_empty((0,))
    return (
        hidden.new_empty((), dtype=row_dtype),
        hidden.new_empty(hidden.shape) if grad_mask[0] else empty,
        weight.new_empty(weight.shape) if grad_mask[1] else empty,
        bias.new_empty(bias.shape) if (grad_mask[2] and bias is not None) else empty,
    )


@torch.library.register_fake("fused::linear_cross_entropy")
def _linear_cross_entropy_fake(hidden, weight, target, bias=None, ignore_index=-100,
                               label_smoothing=0.0, z_loss=0.0, mean=True, chunk_size=0,
                               grad_mask=(False, False, False)):
    _lce_check(hidden, weight, target, bias, "fused::linear_cross_entropy")
    return _lce_outputs(hidden, weight, bias, grad_mask, _row_dtype(hidden))


@torch.library.impl("fused::linear_cross_entropy", ["CPU", "CUDA"])
def _linear_cross_entropy_kernel(hidden, weight, target, bias=None, ignore_index=-100,
                                 label_smoothing=0.0, z_loss=0.0, mean=True, chunk_size=0,
                                 grad_mask=(False, False, False)):
    op = "fused::linear_cross_entropy"
    _lce_check(hidden, weight, target, bias, op)
    torch._check(chunk_size >= 0, lambda: f"{op}: expected chunk_size >= 0, but got {chunk_size}")
    H = weight.shape[1]
    h2 = hidden.reshape(-1, H)
    t = target.reshape(-1)
    n = h2.shape[0]
    dt = _row_dtype(hidden)
    loss_out, grad_h, grad_w, grad_b = _lce_outputs(hidden, weight, bias, grad_mask, dt)
    want_h, want_w, want_b = grad_mask[0], grad_mask[1], grad_mask[2] and bias is not None
    any_grad = want_h or want_w or want_b
    grad_h2 = grad_h.view(-1, H) if want_h else None
    if want_w:
        grad_w.zero_()
    if want_b:
        grad_b.zero_()
    # The gradient each row's loss gets: 1 / (rows not ignored) for 'mean', 1 for 'sum'.
    count = (t != ignore_index).sum()
    row_grad = (1.0 / count.to(dt)) if mean else torch.ones((), dtype=dt, device=hidden.device)
    rows = torch.empty(n, dtype=dt, device=hidden.device)
    chunk = chunk_size or DEFAULT_CHUNK
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        h = h2[start:end]
        tc = t[start:end]
        logits = ops.linear(h, weight, bias)
        loss_c, lse_c = ops.cross_entropy(logits, tc, ignore_index, label_smoothing, z_loss)
        rows[start:end] = loss_c
        if not any_grad:
            continue
        ops.cross_entropy_backward_(row_grad.expand(end - start), logits, tc, lse_c,
                                    ignore_index, label_smoothing, z_loss)
        if want_h:
            grad_h2[start:end] = ops.matmul(logits, weight)
        if want_w:
            grad_w.addmm_(logits.t(), h)
        if want_b:
            grad_b += logits.sum(0, dtype=dt).to(grad_b.dtype)
    total = rows.sum()
    loss_out.copy_(total / count.to(dt) if mean else total)
    return loss_out, grad_h, grad_w, grad_b
