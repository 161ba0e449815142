"""Unfused compositions of PyTorch ops: what the fused kernels replace.

Tests compare the fused ops against these (in float64), and the benchmark times them as
the "unfused" implementation and, through torch.compile, as the "compile" one. Each is
written the way a user would write it without a fused kernel: one PyTorch op per step.
"""
import math

import torch


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3))
        return 0.5 * x * (1.0 + torch.tanh(inner))
    return 0.5 * x * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))


def causal_mask(lq: int, lk: int, device=None) -> torch.Tensor:
    """True where key j > query i (masked), as scaled_dot_product_attention(is_causal=True)."""
    return torch.ones(lq, lk, dtype=torch.bool, device=device).triu(1)


def softmax(x: torch.Tensor, dim: int = -1, *, scale: float = 1.0,
            causal: bool = False) -> torch.Tensor:
    if scale != 1.0:
        x = x * scale
    if causal:
        x = x.masked_fill(causal_mask(x.shape[-2], x.shape[-1], x.device), float("-inf"))
    m = torch.amax(x, dim, keepdim=True)
    e = torch.exp(x - m)
    return e / torch.sum(e, dim, keepdim=True)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    z = x - torch.amax(x, dim, keepdim=True)
    return z - torch.log(torch.sum(torch.exp(z), dim, keepdim=True))
