"""Values of a matmul knob against each other in one process: the tile order's group height
(FUSED_OPS_MATMUL_GROUP_M, matmul_common.cuh tile_coords; KERNEL_LOG matmul v11) by default,
or another environment variable the launcher reads on every call (--knob; e.g.
FUSED_OPS_MATMUL_SPLIT_TAIL in the build of commit ae106e3, v12).

    python benchmarks/dev/gemm_group.py [--knob NAME] [--groups 8,16,4] [--rounds R] [--ncu]
        [MxNxK ...]

Each round times, for every value (--groups), the fused mm and bias + gelu_tanh (bf16), then
cuBLAS's mm and cuBLASLt's bias + gelu, as triton.testing.do_bench medians over 300 ms of
back-to-back calls (the board's power limit holds, as in training); the values rotate
between rounds so none is always timed first. --ncu instead runs each value's fused mm and
bias + gelu_tanh once each between cudaProfilerStart / Stop, for `ncu --profile-from-start
off` (DRAM bytes, time at a fixed clock).
"""
import os
import sys

import torch
from triton.testing import do_bench

from linear_cases import linear_cases

args = sys.argv[1:]


def option(name, default):
    if name in args:
        i = args.index(name)
        value = args[i + 1]
        del args[i:i + 2]
        return value
    return default


knob = option("--knob", "FUSED_OPS_MATMUL_GROUP_M")
groups = option("--groups", "8,16,4").split(",")
rounds = int(option("--rounds", "3"))
ncu = "--ncu" in args
args = [a for a in args if a != "--ncu"]
shapes = args or ["4096x4096x4096", "8192x8192x8192", "16384x4096x4096", "4096x16384x4096",
                  "16384x4096x16384"]
torch.manual_seed(0)
print(torch.cuda.get_device_name())
for s in shapes:
    (m, n, k), every = linear_cases(s)
    if ncu:
        for g in groups:
            os.environ[knob] = g
            every["fused mm"]()
            every["fused +bias+gelu_tanh"]()
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            every["fused mm"]()
            every["fused +bias+gelu_tanh"]()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"{s:>16} group {g} profiled (fused mm, then +bias+gelu_tanh)")
        continue
    res = {}
    for r in range(rounds):
        order = groups[r % len(groups):] + groups[:r % len(groups)]
        for g in order:
            os.environ[knob] = g
            for name in ("fused mm", "fused +bias+gelu_tanh"):
                t = do_bench(every[name], warmup=50, rep=300, return_mode="median") * 1e3
                res.setdefault(f"{name} g{g}", []).append(t)
        for name in ("cublas mm", "cublasLt bias+gelu"):
            t = do_bench(every[name], warmup=50, rep=300, return_mode="median") * 1e3
            res.setdefault(name, []).append(t)
    os.environ.pop(knob)
    base = min(res[f"fused mm g{groups[0]}"])
    for name, t in res.items():
        tf = 2 * m * n * k / (min(t) * 1e-6) / 1e12
        print(f"{s:>16} {name:<28} " + " ".join(f"{v:8.1f}" for v in t) +
              f" us  {tf:6.0f} TFLOP/s  {(min(t) / base - 1) * 100:+5.1f}% vs fused mm g{groups[0]}")
