"""How exact each bias + GeLU(tanh) linear forward is, against float64: ours (fused_ops.linear),
cuBLASLt's fused epilogue (torch._addmm_activation) and eager F.gelu(F.linear).

    python tools/gelu_epilogue_accuracy.py [MxNxK ...] [--dtype bf16|fp16]

The exact result y = gelu_tanh(x W^T + b) is computed in float64 from the same 16-bit
inputs and rounded to the dtype (the best a 16-bit output can be). Per implementation:
the share of elements that differ from that rounding, the largest distance in units of the
dtype's last place (ulp of the exact value; over |exact| >= 1e-3 only, since near the
zero crossing the float32 accumulation's own error is many ulps of a tiny value), and the same
for the elements with pre-activation z < -1.5, where 1 + tanh(u) is small and a tanh-based
form cancels.
"""

import sys

import torch
import torch.nn.functional as F

import fused_ops
from fused_ops import reference

args = sys.argv[1:]
dtype = torch.bfloat16
if "--dtype" in args:
    i = args.index("--dtype")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args[i + 1]]
    del args[i : i + 2]
shapes = args or ["4096x4096x4096"]
mant = 8 if dtype == torch.bfloat16 else 11  # significant bits


def ulps(actual, exact):
    """|actual - exact| in units of the dtype's last place at |exact| (normal range)."""
    e = exact.abs().clamp_min(torch.finfo(dtype).tiny)
    ulp = torch.exp2(torch.floor(torch.log2(e)) - (mant - 1))
    return (actual.double() - exact).abs() / ulp


torch.manual_seed(0)
print(torch.cuda.get_device_name(), dtype)
for s in shapes:
    m, n, k = (int(v) for v in s.split("x"))
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
    b = torch.randn(n, device="cuda", dtype=dtype)
    z = x.double() @ w.double().t() + b.double()
    y = reference.gelu(z, "tanh")
    best = y.to(dtype)
    neg = z < -1.5
    impls = {
        "fused_ops.linear": lambda: fused_ops.linear(x, w, b, "gelu_tanh"),
        "cuBLASLt _addmm_activation": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True),
        "eager F.gelu(F.linear)": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
    }
    print(f"{s}: {neg.double().mean().item() * 100:.1f}% of elements have z < -1.5")
    for name, f in impls.items():
        out = f()
        torch.cuda.synchronize()
        d = ulps(out, y)
        d[y.abs() < 1e-3] = 0
        off = out != best
        print(
            f"  {name:<28} differs from the rounded exact value: {off.double().mean().item() * 100:6.2f}%"
            f"  max {d.max().item():8.2f} ulp  mean {d.mean().item():.3f} ulp"
            f" | z < -1.5: {off[neg].double().mean().item() * 100:6.2f}%"
            f"  max {d[neg].max().item():8.2f} ulp  max abs err {(out.double() - y)[neg].abs().max().item():.2e}"
        )
