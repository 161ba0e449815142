"""The linear-layer cases the dev timing scripts share (linear_epilogue.py, gemm_power.py):
bf16 x [M, K], weight [N, K] scaled to O(1) outputs, bias [N], and each implementation as
a zero-argument callable by name."""

import torch
import torch.nn.functional as F

import fused_ops


def linear_cases(shape, constant=False):
    """(M, N, K) and {name: callable} for an "MxNxK" string; constant: x and the weight
    all one value each (fewer bits toggling in the tensor cores: less energy a FLOP)."""
    m, n, k = (int(v) for v in shape.split("x"))
    if constant:
        x = torch.full((m, k), 0.5, device="cuda", dtype=torch.bfloat16)
        w = torch.full((n, k), k**-0.5, device="cuda", dtype=torch.bfloat16)
    else:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    return (m, n, k), {
        "fused mm": lambda: fused_ops.linear(x, w),
        "fused +bias": lambda: fused_ops.linear(x, w, b),
        "fused +gelu_tanh": lambda: fused_ops.linear(x, w, None, "gelu_tanh"),
        "fused +bias+gelu_tanh": lambda: fused_ops.linear(x, w, b, "gelu_tanh"),
        "fused +bias+gelu(erf)": lambda: fused_ops.linear(x, w, b, "gelu"),
        "cublas mm": lambda: torch.mm(x, w.t()),
        "cublas F.linear+bias": lambda: F.linear(x, w, b),
        "cublasLt bias+gelu": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True),
        "eager F.gelu(F.linear)": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
    }
