# torch.mm (cuBLAS) bf16 reference timings for the portable-kernel sweep, same shapes/layouts.
import torch
from triton.testing import do_bench
print(torch.cuda.get_device_name())
for s in (4096, 8192):
    a = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    for name, f in (("TN(A K, B K)", lambda: a @ b.t()), ("NN(A K, B MN)", lambda: a @ b),
                    ("TT(A MN, B MN)", lambda: a.t() @ b)):
        ms = do_bench(f, warmup=50, rep=300)
        print(f"  torch.mm {s}^3 {name:15s} {ms*1e3:8.1f} us {2*s**3/ms/1e9:6.1f} TFLOP/s")
