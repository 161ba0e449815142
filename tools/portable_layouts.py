# The portable GEMM's three compiled operand layouts (TN: A and B K-major, as a linear layer's
# forward; NN: B MN-major, a plain row-major matmul; TT: both MN-major, as dW = dZ^T X), on
# the Big tile (4096^3, 8192^3) and the Small one (1024 x 1024 x 8192: 32 Big tiles, fewer
# than the SMs), forced onto the portable kernel; bf16, do_bench, with each result checked
# against torch.mm. For A/B runs of a loader change: run it once per build.
import torch
from triton.testing import do_bench

import fused_ops
from fused_ops.overrides import overrides

print(torch.cuda.get_device_name())
SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (1024, 1024, 8192))
with overrides("matmul.kernel=portable"):  # the portable kernel even on Hopper
    for m, n, k in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)  # A, K-major
        xt = x.t().contiguous().t()  # A, MN-major
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
        layouts = {"TN": (x, w.t()), "NN": (x, w.t().contiguous()), "TT": (xt, w.t().contiguous())}
        for name, (a, b) in layouts.items():
            err = ((fused_ops.matmul(a, b).float() - (a @ b).float()).abs().max()).item()
            ms = do_bench(lambda: fused_ops.matmul(a, b), warmup=50, rep=300)
            print(
                f"  {m}x{n}x{k} {name}: {ms * 1e3:8.1f} us {2 * m * n * k / ms / 1e9:6.1f} "
                f"TFLOP/s (max |diff| vs torch.mm {err:.3g})"
            )
