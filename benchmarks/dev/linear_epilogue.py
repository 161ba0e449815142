"""Where the fused linear's epilogue time goes (Hopper kernel, bf16): the fused op with and
without bias / activation next to cuBLAS (torch.mm, F.linear, the cuBLASLt gelu epilogue),
each timed twice, interleaved, as triton.testing.do_bench medians (ms).

    python benchmarks/dev/linear_epilogue.py [--reverse] [--rounds R] [MxNxK ...]

--reverse times the cases in the opposite order (the first case timed at each shape runs on
the coolest GPU: KERNEL_LOG matmul v6, "4096^3").
"""
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import fused_ops

args = sys.argv[1:]
reverse = "--reverse" in args
rounds = 2
if "--rounds" in args:
    rounds = int(args[args.index("--rounds") + 1])
    del args[args.index("--rounds"):args.index("--rounds") + 2]
shapes = [a for a in args if a != "--reverse"] or ["4096x4096x4096", "16384x4096x4096",
                                                  "8192x8192x8192"]
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
    if reverse:
        cases = dict(reversed(list(cases.items())))
    res = {name: [] for name in cases}
    for _ in range(rounds):
        for name, f in cases.items():
            res[name].append(do_bench(f, warmup=50, rep=300, return_mode="median") * 1e3)
    base = min(res["fused mm"])
    for name, t in res.items():
        tf = 2 * m * n * k / (min(t) * 1e-6) / 1e12
        print(f"{s:>16} {name:<24} " + " ".join(f"{v:8.1f}" for v in t) + f" us  {tf:6.0f} TFLOP/s  "
              f"{(min(t) / base - 1) * 100:+5.1f}% vs fused mm")
