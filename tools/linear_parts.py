"""Where the fused linear layer's forward+backward time goes (bf16), next to eager cuBLAS
doing the same GEMMs: the forward GEMM (training form: z and y stored), dZ = dY gelu'(Z)
with the bias sums, dX = dZ W (B operand N-major) and dW = dZ^T X (both operands
MN-major). do_bench medians (us), two interleaved rounds, the better one printed.

    python tools/linear_parts.py [MxNxK ...]
"""

import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import fused_ops  # noqa: F401  (registers torch.ops.fused)

ops = torch.ops.fused
shapes = sys.argv[1:] or [
    "4096x4096x4096",
    "16384x4096x4096",
    "4096x16384x4096",
    "8192x8192x8192",
    "16384x4096x16384",
]
torch.manual_seed(0)
print(torch.cuda.get_device_name())
for s in shapes:
    m, n, k = (int(v) for v in s.split("x"))
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, **bf)
    w = torch.randn(n, k, **bf) / k**0.5
    b = torch.randn(n, **bf)
    z = torch.randn(m, n, **bf)
    dy = torch.randn(m, n, **bf)
    dz = torch.randn(m, n, **bf)
    cases = {
        "fwd fused linear_fwd": lambda: ops.linear_fwd(x, w, b, "gelu_tanh"),
        "fwd fused linear (inference)": lambda: ops.linear(x, w, b, "gelu_tanh"),
        "fwd eager addmm": lambda: F.linear(x, w, b),
        "fwd eager addmm+gelu": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
        "dZ fused act_backward+bias": lambda: ops.linear_act_backward(dy, z, "gelu_tanh", True),
        "dZ eager gelu_backward+sum": lambda: torch.ops.aten.gelu_backward(
            dy, z, approximate="tanh"
        ).sum(0),
        "dX fused dZ W": lambda: ops.matmul(dz, w),
        "dX cublas dZ W": lambda: torch.mm(dz, w),
        "dW fused dZ^T X": lambda: ops.matmul(dz.t(), x),
        "dW cublas dZ^T X": lambda: torch.mm(dz.t(), x),
    }
    res = {name: [] for name in cases}
    for _ in range(2):
        for name, f in cases.items():
            res[name].append(do_bench(f, warmup=30, rep=200, return_mode="median") * 1e3)
    for name, t in res.items():
        print(f"{s:>16} {name:<30} {min(t):9.1f} us   (rounds {t[0]:.1f} / {t[1]:.1f})")
