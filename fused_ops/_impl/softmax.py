import torch

ops = torch.ops.fused


def _check_dim(x, dim, op):
    n = max(x.dim(), 1)
    torch._check(-n <= dim < n, lambda: f"{op}: expected dim in [{-n}, {n - 1}] for a "
                 f"{x.dim()}-d input, but got dim={dim}")


# Outputs are contiguous tensors of the input's shape (the kernels return them so).
@torch.library.register_fake("fused::softmax")
def _softmax_fake(x, dim=-1, *, scale=1.0, causal=False):
    _check_dim(x, dim, "fused::softmax")
    if causal:
        torch._check(x.dim() >= 2, lambda: "fused::softmax: causal=True needs an input with "
                     f"at least 2 dims (..., query, key), but got a {x.dim()}-d input")
    return x.new_empty(x.shape)


@torch.library.register_fake("fused::log_softmax")
def _log_softmax_fake(x, dim=-1):
    _check_dim(x, dim, "fused::log_softmax")
    return x.new_empty(x.shape)


@torch.library.register_fake("fused::softmax_backward")
def _softmax_backward_fake(grad_out, y, dim=-1, *, scale=1.0, causal=False):
    return y.new_empty(y.shape)


@torch.library.register_fake("fused::log_softmax_backward")
def _log_softmax_backward_fake(grad_out, y, dim=-1):
    return y.new_empty(y.shape)


# Both backwards need only the forward's output y (dx = scale * y * (dy - sum(dy * y)) and
# dx = dy - exp(y) * sum(dy)), so x is not saved. With causal, the backward skips the
# masked entries (y = 0 there).
def _softmax_setup_context(ctx, inputs, keyword_only_inputs, output):
    ctx.dim = inputs[1]
    ctx.scale = keyword_only_inputs.get("scale", 1.0)
    ctx.causal = keyword_only_inputs.get("causal", False)
    ctx.save_for_backward(output)


def _softmax_backward(ctx, grad_out):
    (y,) = ctx.saved_tensors
    return ops.softmax_backward(grad_out, y, ctx.dim, scale=ctx.scale, causal=ctx.causal), None


def _log_softmax_setup_context(ctx, inputs, output):
    ctx.dim = inputs[1]
    ctx.save_for_backward(output)


def _log_softmax_backward(ctx, grad_out):
    (y,) = ctx.saved_tensors
    return ops.log_softmax_backward(grad_out, y, ctx.dim), None


torch.library.register_autograd(
    "fused::softmax", _softmax_backward, setup_context=_softmax_setup_context
)
torch.library.register_autograd(
    "fused::log_softmax", _log_softmax_backward, setup_context=_log_softmax_setup_context
)
