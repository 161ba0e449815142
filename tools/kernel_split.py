"""Where a harness row's time goes: the kernels one repetition of a benchmark case runs
(the harness's own step, L2 flushed before each repetition), each kernel's mean device
time from torch.profiler, and their sum against the event-timed step (the difference is
the GPU idle between kernels).

    python tools/kernel_split.py layer_norm,16384x4096,fwd+bwd[,bf16[,impl]] ...

One argument per row; impl: fused (default), native, compile, ... (the case's
implementations).
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import harness

REPS = 20


def split(op, shape, pass_, dtype, impl):
    cases = [c for c in harness.discover_cases() if c.op == op]
    if not cases:
        raise SystemExit(f"unknown op {op}")
    case = cases[0]
    fn = harness.make_compiled(case) if impl == "compile" else case.impls[impl]
    inputs = harness.make_inputs(case, shape, dtype, pass_)
    step = harness.make_step(fn, inputs, pass_, case.grad_inputs)
    timer = harness.Timer(budget_ms=20)
    for _ in range(3):
        step()
    timer.sync()
    evt = sorted(timer.timed(step, REPS, host_us=200.0))[REPS // 2]

    def kernels(run):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(REPS):
                run()
            timer.sync()
        return {
            e.key: (e.device_time_total / REPS, e.count / REPS)
            for e in prof.key_averages()
            if e.device_time_total > 0
        }

    flush = kernels(timer.flush)
    both = kernels(lambda: (timer.flush(), step()))
    rows, total = [], 0.0
    for key, (t, n) in both.items():
        ft, fn_ = flush.get(key, (0.0, 0.0))
        t, n = t - ft, n - fn_
        if n > 0.5:
            rows.append((t, n, key))
            total += t
    label = f"{op} {harness.shape_str(shape)} {pass_} {harness.dtype_name(dtype)} {impl}"
    print(f"{label}: step {evt:.1f} us (events, median); kernels {total:.1f} us")
    for t, n, key in sorted(rows, reverse=True):
        print(f"  {t:8.1f} us  x{n:g}  {key[:110]}")


def main(argv):
    print(torch.cuda.get_device_name())
    for spec in argv:
        op, shape, pass_, *rest = spec.split(",")
        dtype = harness.parse_dtypes(rest[0])[0] if rest else torch.bfloat16
        split(op, harness.parse_shape(shape), pass_, dtype, rest[1] if len(rest) > 1 else "fused")


if __name__ == "__main__":
    main(sys.argv[1:])
