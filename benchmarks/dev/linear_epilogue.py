"""Where the fused linear's epilogue time goes (Hopper kernel, bf16): the fused op with and
without bias / activation next to cuBLAS (torch.mm, F.linear, the cuBLASLt gelu epilogue),
each timed twice, interleaved, as triton.testing.do_bench medians (ms).

    python benchmarks/dev/linear_epilogue.py [MxNxK ...]
"""
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import fused_ops

shapes = sys.argv[1:] or ["4096x4096x4096", "16384x4096x4096", "8192x8192x8192"]
torch.manual_seed(0)
print(torch.cuda.get_device_name())
for s in shapes:
    m, n, k = (int(v) for v in s.split("x"))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    cases = {
        "fused mm": lambda: fused_ops.linear(x, w),
        "fused +bias": lambda: fused_ops.linear(x, w, b),
        "fused +gelu_tanh": lambda: fused_ops.linear(x, w, None, "gelu_tanh"),
        "fused +bias+gelu_tanh": lambda: fused_ops.linear(x, w, b, "gelu_tanh"),
        "cublas mm": lambda: torch.mm(x, w.t()),
        "cublas F.linear+bias": lambda: F.linear(x, w, b),
        "cublasLt bias+gelu": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True),
    }
    res = {name: [] for name in cases}
    for _ in range(2):
        for name, f in cases.items():
            res[name].append(do_bench(f, warmup=50, rep=300, return_mode="median") * 1e3)
    base = min(res["fused mm"])
    for name, t in res.items():
        tf = 2 * m * n * k / (min(t) * 1e-6) / 1e12
        print(f"{s:>16} {name:<24} {t[0]:8.1f} {t[1]:8.1f} us  {tf:6.0f} TFLOP/s  "
              f"{(min(t) / base - 1) * 100:+5.1f}% vs fused mm")
