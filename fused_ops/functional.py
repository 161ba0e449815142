"""The torch.nn.functional-style API: same names, same arguments, fused kernels.

Swap `F.gelu` for `fused_ops.gelu` and nothing else changes.
"""
import torch

ops = torch.ops.fused

__all__ = [
    "gelu",
    "softmax",
    "log_softmax",
]


def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GeLU, as torch.nn.functional.gelu: approximate is 'none' (erf) or 'tanh'."""
    return ops.gelu(input, approximate=approximate)


def softmax(input: torch.Tensor, dim: int = -1, _stacklevel: int = 3,
            dtype: torch.dtype = None, *, scale: float = 1.0,
            causal: bool = False) -> torch.Tensor:
    """softmax(scale * input) along dim, as torch.nn.functional.softmax (same positional
    arguments; default dim: the last; _stacklevel is accepted and unused).

    causal=True treats the last two dims as (query i, key j) and masks keys j > i before
    the softmax (output 0 there), as scaled_dot_product_attention(is_causal=True); it
    needs dim=-1. With dtype, the input is cast first, as in torch.nn.functional.softmax.
    """
    if dtype is not None:
        input = input.to(dtype)
    return ops.softmax(input, dim, scale=scale, causal=causal)


def log_softmax(input: torch.Tensor, dim: int = -1, _stacklevel: int = 3,
                dtype: torch.dtype = None) -> torch.Tensor:
    """log_softmax along dim, as torch.nn.functional.log_softmax (default dim: the last)."""
    if dtype is not None:
        input = input.to(dtype)
    return ops.log_softmax(input, dim)
