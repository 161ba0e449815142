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


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None, activation=None) -> torch.Tensor:
    y = torch.nn.functional.linear(x, weight, bias)
    if activation == "gelu":
        return torch.nn.functional.gelu(y)
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(y, approximate="tanh")
    return y
