"""The torch.nn.functional-style API: same names, same arguments, fused kernels.

Swap `F.gelu` for `fused_ops.gelu` and nothing else changes.
"""
import torch

ops = torch.ops.fused

__all__ = [
    "gelu",
]


def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GeLU, as torch.nn.functional.gelu: approximate is 'none' (erf) or 'tanh'."""
    return ops.gelu(input, approximate=approximate)
