"""Profile one op: a Chrome/Perfetto trace per implementation and a kernel summary.

    python profiling/trace.py --op gelu
    python profiling/trace.py --op gelu --variant tanh --shape 16384x4096 --dtype bf16 \\
        --pass fwd+bwd --out traces/

For every implementation of the matching benchmark case(s) (benchmarks/cases: fused,
native, unfused, compile, ...): warm up, then run --iters calls under torch.profiler
(CPU + CUDA activities), write traces/<op>_<variant>_<impl>_<pass>.json (open it in
https://ui.perfetto.dev or chrome://tracing) and print the kernels one call launches, with
their count and device time, so "unfused = 5 kernels, fused = 1" is visible.
"""

import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import harness  # noqa: E402

# Kineto trace categories of device activity; a kernel is a launch, so are memcpy/memset.
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--op", required=True, help="op name (or case file name), e.g. gelu")
    p.add_argument("--variant", help="only this variant (e.g. tanh); default: all")
    p.add_argument("--shape", help="e.g. 16384x4096; default: the case's first quick shape")
    p.add_argument("--dtype", default="bf16", help="bf16 (default), fp16, fp32")
    p.add_argument("--pass", dest="pass_", default="fwd", choices=harness.PASSES)
    p.add_argument("--impls", help="comma-separated subset, e.g. fused,unfused")
    p.add_argument("--iters", type=int, default=5, help="profiled calls (default 5)")
    p.add_argument("--out", default="traces", help="trace folder (default traces/)")
    return p.parse_args(argv)


def short_name(name: str, width: int = 90) -> str:
    """A readable kernel name: no 'void ', no parameter list, no anonymous namespaces;
    long template argument lists cut to `width` characters."""
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    name = name.replace("(anonymous namespace)::", "")
    # Drop the trailing parameter list "(...)" when the name ends with one.
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                if i > 0:
                    name = name[:i]
                break
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[: width - 1] + "…"


def summarize_trace(trace: dict, iters: int) -> list:
    """Device activity of a Chrome trace (as torch.profiler exports it), per kernel name:
    [{"name", "count", "total_us", "avg_us", "per_call"}], most time first."""
    rows = {}
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X" or ev.get("cat") not in DEVICE_CATS:
            continue
        name = short_name(ev.get("name", "?"))
        row = rows.setdefault(name, {"name": name, "count": 0, "total_us": 0.0})
        row["count"] += 1
        row["total_us"] += float(ev.get("dur", 0.0))
    out = sorted(rows.values(), key=lambda r: -r["total_us"])
    for r in out:
        r["avg_us"] = r["total_us"] / r["count"]
        r["per_call"] = r["count"] / max(iters, 1)
    return out


def format_summary(impl: str, rows: list, iters: int) -> str:
    launches = sum(r["count"] for r in rows) / max(iters, 1)
    device_us = sum(r["total_us"] for r in rows) / max(iters, 1)
    lines = [
        f"{impl}: {launches:g} kernel launch{'es' if launches != 1 else ''} per call, "
        f"{device_us:.1f} us of device time per call"
    ]
    lines.append(f"  {'per call':>8}  {'avg us':>9}  {'total us':>9}  kernel")
    for r in rows:
        lines.append(
            f"  {r['per_call']:>8g}  {r['avg_us']:>9.1f}  {r['total_us']:>9.1f}  {r['name']}"
        )
    return "\n".join(lines)


def trace_path(out_dir, case, impl, pass_) -> str:
    parts = [case.op, case.variant, impl, pass_.replace("+", "")]
    return os.path.join(out_dir, "_".join(p for p in parts if p) + ".json")


def profile_impl(case, impl, shape, dtype, pass_, iters, path, device="cuda"):
    """Warm up one implementation, profile `iters` calls, export the trace, return its
    kernel summary rows."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    inputs = harness.make_inputs(case, shape, dtype, pass_, device)
    fn = harness.make_compiled(case) if impl == "compile" else case.impls[impl]
    step = harness.make_step(fn, inputs, pass_, case.grad_inputs)
    for _ in range(3):  # compile, allocate, load kernels
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            with record_function(f"{impl} call {i}"):
                step()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    with open(path) as f:
        return summarize_trace(json.load(f), iters)


def main(argv=None):
    args = parse_args(argv)
    try:
        dtype = harness.parse_dtypes(args.dtype)[0]
        shape = harness.parse_shape(args.shape) if args.shape else None
    except (ValueError, IndexError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    harness.require_cuda("profiling")
    harness.import_fused_ops()
    import torch

    cases = [
        c
        for c in harness.discover_cases()
        if args.op in (c.op, c.label, getattr(c, "module", None))
        and (args.variant is None or c.variant == args.variant)
    ]
    if not cases:
        print(
            f"error: no benchmark case for op {args.op!r}"
            + (f" variant {args.variant!r}" if args.variant else ""),
            file=sys.stderr,
        )
        return 2
    harness.configure_compile()
    os.makedirs(args.out, exist_ok=True)
    wanted = {s.strip() for s in (args.impls or "").split(",") if s.strip()}
    for case in cases:
        if args.pass_ not in case.passes:
            continue
        case_shape = shape or case.quick_shapes[0]
        print(
            f"\n== {case.label} {args.pass_} {harness.shape_str(case_shape)} "
            f"{harness.dtype_name(dtype)} ({args.iters} calls profiled)"
        )
        counts = {}
        for impl in case.impl_names():
            if wanted and impl not in wanted:
                continue
            path = trace_path(args.out, case, impl, args.pass_)
            try:
                if impl == "compile":
                    torch._dynamo.reset()
                rows = profile_impl(case, impl, case_shape, dtype, args.pass_, args.iters, path)
            except Exception as e:  # noqa: BLE001 - report and profile the others
                print(f"{impl}: failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            print(format_summary(impl, rows, args.iters))
            if not rows:
                print("  (no GPU activity recorded: is CUPTI available to torch.profiler?)")
            print(f"  trace: {path}")
            counts[impl] = sum(r["count"] for r in rows) / args.iters
            torch.cuda.empty_cache()
        if counts:
            print(
                "kernel launches per call: "
                + ", ".join(f"{impl} {n:g}" for impl, n in counts.items())
            )
    print("\nOpen a trace in https://ui.perfetto.dev (or chrome://tracing).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
