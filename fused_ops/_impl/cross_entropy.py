"""Fake kernels and autograd of fused::cross_entropy.

The forward returns the per-row loss and the per-row logsumexp (lse); the backward needs no
reduction of its own: dlogits = g ((1 + 2 z lse) softmax(x) - eps / V - (1 - eps) onehot(t)),
with softmax(x) = exp(x - lse), reads the logits once and writes the gradient once.
With inplace_backward=True that gradient is written over the logits (their storage is
consumed: nothing may read them after the backward), which saves a [rows, V] buffer.
"""
import torch

ops = torch.ops.fused


def _row_dtype(logits):
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _check(logits, target, label_smoothing, op):
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
                        inplace_backward=False):
    _check(logits, target, label_smoothing, "fused::cross_entropy")
    dt = _row_dtype(logits)
    return (logits.new_empty(target.shape, dtype=dt), logits.new_empty(target.shape, dtype=dt))


@torch.library.register_fake("fused::cross_entropy_backward")
def _cross_entropy_backward_fake(grad_loss, logits, target, lse, ignore_index, label_smoothing,
                                 z_loss):
    _check(logits, target, label_smoothing, "fused::cross_entropy_backward")
    return logits.new_empty(logits.shape)


@torch.library.register_fake("fused::cross_entropy_backward_")
def _cross_entropy_backward_inplace_fake(grad_loss, logits, target, lse, ignore_index,
                                         label_smoothing, z_loss):
    _check(logits, target, label_smoothing, "fused::cross_entropy_backward_")
    return None


def _setup_context(ctx, inputs, output):
    logits, target, ignore_index, label_smoothing, z_loss, inplace = (list(inputs) + [
        -100, 0.0, 0.0, False][len(inputs) - 2:])[:6]
    ctx.args = (ignore_index, label_smoothing, z_loss)
    ctx.inplace = inplace
    ctx.save_for_backward(logits, target, output[1])
    ctx.set_materialize_grads(False)  # lse receives no gradient: no zero fill for it


def _backward(ctx, grad_loss, grad_lse):
    if grad_loss is None:
        return (None,) * 6
    logits, target, lse = ctx.saved_tensors
    grad_loss = grad_loss.to(lse.dtype)
    if ctx.inplace:
        ops.cross_entropy_backward_(grad_loss, logits, target, lse, *ctx.args)
        # The op's schema marks logits as written, but a C++-defined op gets no version
        # bump from the dispatcher: bump it here, so a backward that saved the logits and
        # runs after this one reports the in-place write instead of reading the gradient.
        torch.autograd.graph.increment_version(logits)
        return (logits,) + (None,) * 5
    return (ops.cross_entropy_backward(grad_loss, logits, target, lse, *ctx.args),) + (None,) * 5


torch.library.register_autograd("fused::cross_entropy", _backward, setup_context=_setup_context)
