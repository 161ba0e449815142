"""The Hopper kernel's two schedules, with and without the 2-block cluster multicast of B,
side by side (FUSED_OPS_MATMUL_SCHEDULE=cooperative|pingpong x FUSED_OPS_MATMUL_CLUSTER=1|2,
toggled in one process), bf16, next to cuBLAS: the plain GEMM, the bias +
gelu_tanh epilogue (inference op, and the training op that also stores the
pre-activation), and the backward layouts dX = dZ W (B N-major) and dW = dZ^T X (both
MN-major). do_bench medians (us), rounds interleaved, the best round printed.

    python benchmarks/dev/matmul_schedule.py [--rounds R] [MxNxK ...]

Runs against commit 4548b89, where the two knobs exist (both experiments were measured
slower or no faster and reverted; KERNEL_LOG matmul v5-v6).
"""
import argparse
import os

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import fused_ops  # noqa: F401  (registers torch.ops.fused)

ops = torch.ops.fused
ap = argparse.ArgumentParser()
ap.add_argument("shapes", nargs="*", default=["4096x4096x4096", "16384x4096x4096",
                                               "4096x16384x4096", "8192x8192x8192",
                                               "16384x4096x16384"])
ap.add_argument("--rounds", type=int, default=2)
args = ap.parse_args()
torch.manual_seed(0)
print(torch.cuda.get_device_name())
SCHEDULES = {"coop/1": ("cooperative", "1"), "coop/2": ("cooperative", "2"),
             "pp/1": ("pingpong", "1"), "pp/2": ("pingpong", "2")}


def fused(variant, f):
    schedule, cluster = SCHEDULES[variant]

    def run():
        os.environ["FUSED_OPS_MATMUL_SCHEDULE"] = schedule
        os.environ["FUSED_OPS_MATMUL_CLUSTER"] = cluster
        return f()
    return run


for s in args.shapes:
    m, n, k = (int(v) for v in s.split("x"))
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, **bf)
    w = torch.randn(n, k, **bf) / k**0.5
    b = torch.randn(n, **bf)
    dz = torch.randn(m, n, **bf)
    parts = {
        "mm": (lambda: ops.matmul(x, w.t()), lambda: torch.mm(x, w.t())),
        "bias+gelu_tanh": (lambda: ops.linear(x, w, b, "gelu_tanh"),
                           lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)),
        "train fwd (z, y)": (lambda: ops.linear_fwd(x, w, b, "gelu_tanh"),
                             lambda: F.gelu(F.linear(x, w, b), approximate="tanh")),
        "dX = dZ W": (lambda: ops.matmul(dz, w), lambda: torch.mm(dz, w)),
        "dW = dZ^T X": (lambda: ops.matmul(dz.t(), x), lambda: torch.mm(dz.t(), x)),
    }
    cases = {}
    for name, (f, ref) in parts.items():
        for variant in SCHEDULES:
            cases[(name, variant)] = fused(variant, f)
        cases[(name, "cublas")] = ref
    res = {key: [] for key in cases}
    for _ in range(args.rounds):
        for key, f in cases.items():
            res[key].append(do_bench(f, warmup=30, rep=200, return_mode="median") * 1e3)
    os.environ.pop("FUSED_OPS_MATMUL_SCHEDULE", None)
    os.environ.pop("FUSED_OPS_MATMUL_CLUSTER", None)
    names = list(SCHEDULES) + ["cublas"]
    if s == args.shapes[0]:
        print(f"{'shape':>16} {'part':<17} " + " ".join(f"{v:>8}" for v in names)
              + "   (us)  | TFLOP/s in the same order")
    for name in parts:
        t = [min(res[(name, v)]) for v in names]
        tf = [2 * m * n * k / (v * 1e-6) / 1e12 for v in t]
        print(f"{s:>16} {name:<17} " + " ".join(f"{v:8.1f}" for v in t) + "  | "
              + " ".join(f"{v:4.0f}" for v in tf))
