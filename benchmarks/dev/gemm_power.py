"""Is the GEMM power-bound? SM clock and board power while each case runs (bf16, L2 not
flushed: a GEMM this size streams far more than L2 holds), next to its time. Written in
session 17 for KERNEL_LOG matmul v10's open question (does work overlapped with the tensor
cores lower the clock?); not yet run.

    python benchmarks/dev/gemm_power.py [--seconds S] [MxNxK ...]

Each case runs in event-timed batches of 8 calls for S seconds (default 2) while
`nvidia-smi -lms 20` samples clocks.sm and power.draw; the report gives the median time a
call and the median clock and power of the samples in the second half of the case's window.
"""
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F

import fused_ops

args = sys.argv[1:]
seconds = 2.0
if "--seconds" in args:
    seconds = float(args[args.index("--seconds") + 1])
    del args[args.index("--seconds"):args.index("--seconds") + 2]
shapes = args or ["16384x4096x4096", "8192x8192x8192"]

samples = []  # (host time, MHz, W)


def sample():
    proc = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                             "--format=csv,noheader,nounits", "-lms", "20"],
                            stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        try:
            mhz, watts = (float(v) for v in line.split(","))
        except ValueError:
            continue
        samples.append((time.perf_counter(), mhz, watts))
        if stop.is_set():
            proc.terminate()
            return


stop = threading.Event()
threading.Thread(target=sample, daemon=True).start()
time.sleep(1.0)
print(torch.cuda.get_device_name())
for s in shapes:
    m, n, k = (int(v) for v in s.split("x"))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    cases = {
        "fused mm": lambda: fused_ops.linear(x, w),
        "fused +bias+gelu_tanh": lambda: fused_ops.linear(x, w, b, "gelu_tanh"),
        "cublas mm": lambda: torch.mm(x, w.t()),
        "cublasLt bias+gelu": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True),
        "eager F.gelu(F.linear)": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
    }
    for name, f in cases.items():
        f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        times = []  # us a call, per batch of 8 (event-timed: no host gap between batches)
        while time.perf_counter() - t0 < seconds:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(8):
                f()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / 8)
        t1 = time.perf_counter()
        us = statistics.median(times)
        # samples of the second half of the window (clocks settle after a change of load)
        window = [(c, p) for t, c, p in samples if t0 + (t1 - t0) / 2 <= t <= t1]
        mhz = statistics.median(c for c, _ in window) if window else float("nan")
        watts = statistics.median(p for _, p in window) if window else float("nan")
        tf = 2 * m * n * k / (us * 1e-6) / 1e12
        print(f"{s:>16} {name:<24} {us:9.1f} us {tf:6.0f} TFLOP/s  SM {mhz:6.0f} MHz  "
              f"{watts:5.0f} W  ({len(window)} samples)")
stop.set()
