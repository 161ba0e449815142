"""What dropout keeps alive for backward: fused (a 16-byte seed/offset) vs F.dropout (a
one-byte mask per element) vs torch.compile of the unfused composition.

    python benchmarks/dropout_memory.py [--shape 8192 8192] [--dtype bfloat16]

For each implementation: bytes held after the forward while its output is alive (output +
saved tensors), the part of it beyond the output (what backward keeps), and the peak of one
forward+backward above the inputs. The benchmark harness records the same held bytes per
measurement (fwd_held_bytes in the results JSON).
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fused_ops  # noqa: E402
from fused_ops import reference  # noqa: E402

P = 0.1


def held_and_peak(fn, x):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    y = fn(x)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    grad = torch.randn_like(y)
    del y
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    (dx,) = torch.autograd.grad(fn(x), x, grad)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del dx
    return held, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", type=int, nargs="+", default=[8192, 8192])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    x = torch.randn(args.shape, device="cuda", dtype=dtype, requires_grad=True)
    out_bytes = x.numel() * x.element_size()
    impls = {
        "fused": lambda t: fused_ops.dropout(t, P),
        "native": lambda t: F.dropout(t, P),
        "compile": torch.compile(lambda t: reference.dropout(t, P)),
    }
    print(
        f"dropout p={P}, shape {tuple(args.shape)}, {args.dtype}: "
        f"output {out_bytes / 2**20:.1f} MiB"
    )
    print(
        f"{'impl':<8} {'held after fwd MiB':>19} {'saved for bwd MiB':>18} {'peak fwd+bwd MiB':>17}"
    )
    for name, fn in impls.items():
        held_and_peak(fn, x)  # warm-up (compiles)
        held, peak = held_and_peak(fn, x)
        print(
            f"{name:<8} {held / 2**20:>19.2f} {(held - out_bytes) / 2**20:>18.2f} "
            f"{peak / 2**20:>17.2f}"
        )


if __name__ == "__main__":
    main()
