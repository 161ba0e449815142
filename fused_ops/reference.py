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


def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    keep = torch.rand_like(x) >= p
    return x * keep * (1.0 / (1.0 - p))


def bias_dropout_add(x: torch.Tensor, bias, residual: torch.Tensor, p: float = 0.5,
                     training: bool = True) -> torch.Tensor:
    h = x + bias if bias is not None else x
    return residual + torch.nn.functional.dropout(h, p, training)
