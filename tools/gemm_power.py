"""Is the H100 GEMM power-bound? SM clock and board power while each case runs (bf16), next
to its time: does work overlapped with the tensor cores cost more than the same work after
them? (docs/design/matmul.md, "Roofline and standing": every large H100 GEMM sits at the
board's 700 W limit when run back to back.)

    python tools/gemm_power.py [--seconds S] [--constant] [--cases a,b] [MxNxK ...]

--constant: operands of one value each (linear_cases); --cases: a comma-separated subset
of the case names. With FUSED_OPS_OVERRIDES=matmul.kernel=portable, "fused mm" is the
portable kernel (on random data it is power-bound, on constant data not).

Each case is timed once, then enqueued as event-timed batches of 8 calls filling about S
seconds (default 2) with a single synchronize at the end (the GPU never waits for the
host), while `nvidia-smi -i <this GPU> -lms 20` samples clocks.sm, power.draw and
power.draw.instant with nvidia-smi's own timestamps (a pipe may deliver its lines late).
The report gives the median time a call and the median clock and power of the samples in
the second half of the case's window, and the first batch's time a call (before the clock
comes down: what the harness's short bursts see). The activation pass on the producer's
spare warps that raised the question needs a build of commit 2cf44f9
(FUSED_OPS_MATMUL_ACT_PASS=producer|consumer there).
"""

import argparse
import datetime
import statistics
import subprocess
import threading
import time

import torch

from linear_cases import linear_cases

CASES = (
    "fused mm",
    "fused +bias+gelu_tanh",
    "cublas mm",
    "cublasLt bias+gelu",
    "eager F.gelu(F.linear)",
)
parser = argparse.ArgumentParser(description="SM clock and board power per GEMM case")
parser.add_argument(
    "shapes",
    nargs="*",
    metavar="MxNxK",
    default=[
        "4096x4096x4096",
        "8192x8192x8192",
        "16384x4096x4096",
        "4096x16384x4096",
        "16384x4096x16384",
    ],
)
parser.add_argument("--seconds", type=float, default=2.0)
parser.add_argument("--constant", action="store_true")
parser.add_argument("--cases", type=lambda v: tuple(v.split(",")), default=CASES)
args = parser.parse_args()
torch.manual_seed(0)
samples = []  # (epoch seconds, MHz, W average, W instant)
proc = subprocess.Popen(
    [
        "nvidia-smi",
        "-i",
        str(torch.cuda.current_device()),
        "--query-gpu=timestamp,clocks.sm,power.draw,power.draw.instant",
        "--format=csv,noheader,nounits",
        "-lms",
        "20",
    ],
    stdout=subprocess.PIPE,
    text=True,
)


def read_samples():
    for line in proc.stdout:
        parts = [v.strip() for v in line.split(",")]
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((t, float(parts[1]), float(parts[2]), float(parts[3])))
        except (ValueError, IndexError):
            continue  # a header, [N/A] or a field this nvidia-smi lacks


threading.Thread(target=read_samples, daemon=True).start()


def median_of(window, i):
    vals = [s[i] for s in window]
    return statistics.median(vals) if vals else float("nan")


try:
    time.sleep(1.0)
    print(torch.cuda.get_device_name())
    for s in args.shapes:
        (m, n, k), every = linear_cases(s, args.constant)
        cases = {name: every[name] for name in args.cases}
        for name, f in cases.items():
            f()
            torch.cuda.synchronize()
            t = time.perf_counter()
            f()
            torch.cuda.synchronize()
            batches = max(1, int(args.seconds / (8 * (time.perf_counter() - t))))
            events = []
            t0 = time.time()
            for _ in range(batches):
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                for _ in range(8):
                    f()
                end.record()
                events.append((start, end))
            torch.cuda.synchronize()
            t1 = time.time()
            time.sleep(0.1)  # the last samples' lines
            us = statistics.median(a.elapsed_time(e) * 1e3 / 8 for a, e in events)
            us0 = events[0][0].elapsed_time(events[0][1]) * 1e3 / 8
            window = [smp for smp in samples if t0 + (t1 - t0) / 2 <= smp[0] <= t1]
            tf = 2 * m * n * k / (us * 1e-6) / 1e12
            print(
                f"{s:>16} {name:<24} {us:9.1f} us {tf:6.0f} TFLOP/s  "
                f"SM {median_of(window, 1):6.0f} MHz  {median_of(window, 2):5.0f} W "
                f"(instant {median_of(window, 3):5.0f} W, {len(window)} samples); "
                f"first batch {2 * m * n * k / (us0 * 1e-6) / 1e12:6.0f} TFLOP/s"
            )
finally:
    proc.terminate()
    proc.wait()
