"""The copy rate the harness's Timer measures, by size: what a memory-bound op can reach at
the benchmark's smaller shapes (16384x1024 bf16 moves 64 MiB read + written, 32 MiB each
way), against the run's ceiling (a 1 GiB copy, harness.measure_ceilings).

    python tools/copy_vs_size.py

Per size (the bytes of one tensor): torch's device-to-device copy (dst.copy_(src)) and, as
kernel-shaped bounds, an elementwise bf16 x * 1 (one read, one write: a forward's streams) and
x + y (two reads, one write: a norm or softmax backward's x or y, dy and dx), each as % of the
ceiling; timed like the harness (L2 flushed before every repetition, the host held back). A
target of "90% of copy" cannot be met where the copy itself stays below it.
"""

import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from benchmarks import harness  # noqa: E402

MIB = 2**20


def main():
    harness.require_cuda("copy_vs_size")
    timer = harness.Timer(budget_ms=20)
    ceil = harness.measure_ceilings(timer)["copy_gbps"]
    print(f"{torch.cuda.get_device_name()}: ceiling {ceil:,.0f} GB/s (1 GiB copy)")
    print(
        f"{'bytes a tensor':>15} {'copy us':>9} {'copy %':>7} {'x*1 us':>9} {'x*1 %':>7}"
        f" {'x+y us':>9} {'x+y %':>7}"
    )
    for mib in [8, 16, 32, 48, 64, 128, 256, 512]:
        n = mib * MIB // 2
        src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        other = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        t_copy = timer.measure(lambda: dst.copy_(src))["median_us"]
        t_mul = timer.measure(lambda: torch.mul(src, 1, out=dst))["median_us"]
        t_add = timer.measure(lambda: torch.add(src, other, out=dst))["median_us"]
        pct = lambda t, tensors: tensors * n * 2 / (t * 1e-6) / 1e9 / ceil * 100  # noqa: E731
        print(
            f"{mib:>11} MiB {t_copy:>9.1f} {pct(t_copy, 2):>7.1f} {t_mul:>9.1f} "
            f"{pct(t_mul, 2):>7.1f} {t_add:>9.1f} {pct(t_add, 3):>7.1f}"
        )
        del src, other, dst


if __name__ == "__main__":
    main()
