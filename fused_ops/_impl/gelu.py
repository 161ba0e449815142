import torch

ops = torch.ops.fused


@torch.library.register_fake("fused::gelu")
def _gelu_fake(x, *, approximate="none"):
    return torch.empty_like(x)


@torch.library.register_fake("fused::gelu_backward")
def _gelu_backward_fake(grad_out, x, *, approximate="none"):
    return torch.empty_like(x)


def _gelu_setup_context(ctx, inputs, keyword_only_inputs, output):
    (x,) = inputs
    ctx.approximate = keyword_only_inputs["approximate"]
    ctx.save_for_backward(x)


def _gelu_backward(ctx, grad_out):
    (x,) = ctx.saved_tensors
    return ops.gelu_backward(grad_out, x, approximate=ctx.approximate)


torch.library.register_autograd(
    "fused::gelu", _gelu_backward, setup_context=_gelu_setup_context
)
