# Portable GEMM through the extension vs torch.mm (cuBLAS), bf16, same process; run with
# FUSED_OPS_MATMUL_KERNEL=portable. Prints TFLOP/s and the ratio to torch.mm per shape.
import os
import torch
import torch.nn.functional as F
from triton.testing import do_bench
import fused_ops

print(torch.cuda.get_device_name(), "kernel:", os.environ.get("FUSED_OPS_MATMUL_KERNEL"))
for (m, n, k) in ((4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096)):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    fl = 2 * m * n * k
    t_mm = do_bench(lambda: torch.mm(a, b), warmup=50, rep=300)
    t_f = do_bench(lambda: fused_ops.matmul(a, b), warmup=50, rep=300)
    t_lin = do_bench(lambda: F.linear(a, w), warmup=50, rep=300)
    t_fl = do_bench(lambda: fused_ops.linear(a, w, bias, activation="gelu_tanh"), warmup=50, rep=300)
    # linear without bias/activation: separates the TN layout's cost from the epilogue's.
    t_l0 = do_bench(lambda: fused_ops.linear(a, w), warmup=50, rep=300)
    print(f"{m}x{n}x{k}: matmul {fl/t_f/1e9:6.1f} TFLOP/s vs torch.mm {fl/t_mm/1e9:6.1f} "
          f"({t_mm/t_f:5.1%}); linear+gelu_tanh {fl/t_fl/1e9:6.1f} vs F.linear {fl/t_lin/1e9:6.1f} "
          f"({t_lin/t_fl:5.1%}); linear (no bias/act) {fl/t_l0/1e9:6.1f} ({t_lin/t_l0:5.1%})")
