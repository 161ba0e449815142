"""The torch.nn.functional-style API: same names, same arguments, fused kernels.

Swap `F.gelu` for `fused_ops.gelu` and nothing else changes.
"""
import torch

ops = torch.ops.fused

__all__ = [
    "gelu",
    "matmul",
    "linear",
]


def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GeLU, as torch.nn.functional.gelu: approximate is 'none' (erf) or 'tanh'."""
    return ops.gelu(input, approximate=approximate)


def matmul(input: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """torch.matmul for 2-D and 3-D operands (3-D batches broadcast) on the fused GEMM."""
    return ops.matmul(input, other)


def linear(input: torch.Tensor, weight: torch.Tensor, bias=None, activation=None) -> torch.Tensor:
    """F.linear, then activation (None, "gelu" or "gelu_tanh") fused into the GEMM epilogue.

    When a gradient will be needed and there is an activation, the training op also returns
    the pre-activation, so backward does not recompute it.
    """
    if activation is not None and torch.is_grad_enabled() and (
        input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    ):
        return ops.linear_fwd(input, weight, bias, activation)[0]
    return ops.linear(input, weight, bias, activation)
