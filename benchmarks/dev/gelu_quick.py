"""Quick GeLU timing with triton do_bench (L2 flushed, median) used before the harness existed:
fused vs native forward and backward, bf16 and fp32. Run from the repo root on a GPU machine:
    PYTHONPATH=. python benchmarks/dev/gelu_quick.py
"""
import torch, torch.nn.functional as F, fused_ops
from triton.testing import do_bench
print(torch.cuda.get_device_name(), torch.__version__)
n = 1 << 28
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
t = do_bench(lambda: b.copy_(a), return_mode="median")
copy = 2 * n / t / 1e6
print(f"copy {copy:.0f} GB/s")
for dt in (torch.bfloat16, torch.float32):
  for shape in ((16384, 4096), (4096, 32768)):
    x = torch.randn(shape, device="cuda", dtype=dt); dy = torch.randn_like(x)
    for ap in ("none", "tanh"):
        for name, fn in (("fused", lambda: fused_ops.gelu(x, approximate=ap)), ("native", lambda: F.gelu(x, approximate=ap)),
                         ("fused_bwd", lambda: torch.ops.fused.gelu_backward(dy, x, approximate=ap)),
                         ("native_bwd", lambda: torch.ops.aten.gelu_backward(dy, x, approximate=ap))):
            t = do_bench(fn, return_mode="median")
            nb = x.numel() * x.element_size() * (3 if "bwd" in name else 2)
            print(f"{str(dt):15s} {str(shape):14s} {ap:5s} {name:10s} {t*1e3:8.1f} us {nb/t/1e6:7.0f} GB/s {100*nb/t/1e6/copy:5.1f}%")
