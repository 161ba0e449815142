"""Host (CPU) time per call of every fused op beside its native twin, forward and
forward + backward, on tensors so small that the GPU's share is negligible.

    python benchmarks/host_time.py                       # CUDA, bf16, 16x256
    python benchmarks/host_time.py --device cpu          # anywhere (CPU kernels included)
    python benchmarks/host_time.py --ops layer_norm,nn.LayerNorm --calls 5000 --out h.json

What is measured. Each call is timed on the host with time.perf_counter, from entering the
Python function to its return: the Python wrapper, argument checks, the dispatcher,
autograd's bookkeeping, output allocation and the kernel launches (fwd+bwd: the forward
and torch.autograd.grad of its outputs, as benchmarks/harness.make_step builds it). The
figure is the median over all calls (--calls per implementation and pass), so a stray
garbage collection or page fault does not move it.

  --device cuda: before each batch of BATCH calls a spin kernel (torch.cuda._sleep) holds
    the GPU busy for longer than the batch takes to enqueue, so no call ever waits for the
    GPU, and the launch queue (a batch is at most a few hundred launches) never fills: the
    time is the host's alone. A batch whose spin ended before the host finished is counted
    (gpu_idle_batches, in the JSON header and a note on stderr) and the spin lengthened.
    An op that synchronises with the GPU idles it in every batch (so every batch is
    counted) and pays a round trip to the GPU in every call: a real cost, and one to fix.
  --device cpu: the same calls on CPU tensors, on one intra-op thread; the CPU kernels' own
    time is included (small at 16x256 fp32 for the row-wise ops, not for the GEMMs, whose
    fused CPU kernels are plain loops), so the CUDA table is the one the targets are read on.

Fused and native batches alternate in a rotating order, so a drift of the CPU's clock
reaches both. Native twins: F.gelu, F.layer_norm, F.rms_norm, x + r then the native norm,
torch.softmax, torch.log_softmax, F.dropout, r + F.dropout(x + b), torch.mm, F.linear (then
F.gelu), and the torch.nn modules for the fused_ops.nn ones. The "fwd" pass runs on inputs
that do not require grad (inference, decoding); "fwd+bwd" on inputs that do.

Targets (issue 45): fused / native <= 1.0 forward, <= 1.1 forward + backward.
Output: a markdown table on stdout (op | pass | fused µs | native µs | ratio | ...), the
records as JSON (--out; one record per op, pass and implementation, in the DESIGN.md
format with host_us), and --md for the table as a file.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks import harness, report  # noqa: E402

PASSES = ("fwd", "fwd+bwd")
TARGETS = {"fwd": 1.0, "fwd+bwd": 1.1}
# Calls per batch between two spin kernels (CUDA): a fwd+bwd call of the widest op is at
# most ~15 launches, so a batch stays far below the ~1024 entries of CUDA's launch queue.
BATCH = 25
CYCLES_PER_US = harness.Timer.CYCLES_PER_US


@dataclass
class Entry:
    """One row pair of the table: an op (or module) and its native twin.

    make_inputs: (rows, width, dtype, device) -> dict of named tensors
    impls:       {"fused": fn(**inputs), "native": fn(**inputs)}
    grad_inputs: names of the inputs that require grad in the fwd+bwd pass
    """

    name: str
    make_inputs: Callable
    impls: dict
    grad_inputs: tuple = ()
    passes: tuple = PASSES
    module: str = ""  # the benchmark case file it comes from, or "" (for --ops)
    extra: dict = field(default_factory=dict)


def _case_entry(case, shape_of) -> Entry:
    """An Entry from a benchmark case: its fused and native implementations and inputs,
    at the tiny shape shape_of(rows, width) gives for the case."""

    def make(rows, width, dtype, device):
        return dict(case.make_inputs(shape_of(rows, width), dtype, device))

    # A case timed forward only in the benchmark (matmul) names no grad inputs: here its
    # fwd+bwd differentiates every floating-point input.
    grads = case.grad_inputs or tuple(
        n
        for n, t in case.make_inputs(shape_of(2, 8), torch.float32, "cpu").items()
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    )
    return Entry(
        name=case.label,
        make_inputs=make,
        impls={"fused": case.impls["fused"], "native": case.impls["native"]},
        grad_inputs=grads,
        module=getattr(case, "module", ""),
        extra={"shape_of": shape_of},
    )


def _tiny_shape(case):
    """The tiny shape for a case: rows x width for row-wise ops and the MLP (tokens x C),
    (rows, width, width) for the GEMMs (A is rows x width, the weight width x width), and one
    head of rows queries over width keys for the causal softmax."""
    rank = len(case.shapes[0])
    if case.flops is not None and rank == 3:
        return lambda r, w: (r, w, w)
    return lambda r, w: (1,) * (rank - 2) + (r, w)


def _randn(shape, dtype, device, scale=1.0):
    return (torch.randn(shape, device=device, dtype=torch.float32) * scale).to(dtype)


def extra_entries(fused_ops) -> list:
    """Rows the benchmark cases do not have: linear without an activation, and the
    fused_ops.nn modules against their torch.nn twins (what a swapped model calls)."""
    import fused_ops.nn as fnn

    nn = torch.nn
    p = 0.1

    def linear_inputs(rows, width, dtype, device):
        return {
            "x": _randn((rows, width), dtype, device),
            "w": _randn((width, width), dtype, device, width**-0.5),
            "b": _randn((width,), dtype, device),
        }

    def x_only(rows, width, dtype, device):
        return {"x": _randn((rows, width), dtype, device)}

    def module_entry(name, fused_mod, native_mod, params=(), native_owner=""):
        # The native module is given the fused one's Parameter objects (native_owner: the
        # submodule of the native module holding them), so both differentiate the same
        # leaves: fwd+bwd asks for the gradients of x and of every parameter, as training
        # does. The "fwd" pass runs with the parameters not requiring grad (inference).
        def make(rows, width, dtype, device):
            fm = fused_mod(width).to(device=device, dtype=dtype).train()
            nm = native_mod(width).to(device=device, dtype=dtype).train()
            owner = nm.get_submodule(native_owner) if native_owner else nm
            inputs = {"x": _randn((rows, width), dtype, device), "_modules": (fm, nm)}
            for pname in params:
                param = getattr(fm, pname)
                param.requires_grad_(False)
                setattr(owner, pname, param)
                inputs[pname] = param
            return inputs

        return Entry(
            name=name,
            make_inputs=make,
            grad_inputs=("x", *params),
            impls={
                "fused": lambda x, _modules, **_: _modules[0](x),
                "native": lambda x, _modules, **_: _modules[1](x),
            },
        )

    return [
        Entry(
            name="linear",
            make_inputs=linear_inputs,
            grad_inputs=("x", "w", "b"),
            module="matmul",
            impls={
                "fused": lambda x, w, b: fused_ops.linear(x, w, b),
                "native": lambda x, w, b: F.linear(x, w, b),
            },
        ),
        module_entry("nn.LayerNorm", fnn.LayerNorm, nn.LayerNorm, ("weight", "bias")),
        module_entry("nn.RMSNorm", fnn.RMSNorm, nn.RMSNorm, ("weight",)),
        module_entry(
            "nn.GELU/tanh",
            lambda w: fnn.GELU(approximate="tanh"),
            lambda w: nn.GELU(approximate="tanh"),
        ),
        module_entry("nn.Dropout", lambda w: fnn.Dropout(p), lambda w: nn.Dropout(p)),
        module_entry(
            "nn.Linear/gelu_tanh",
            lambda w: fnn.Linear(w, w, activation="gelu_tanh"),
            lambda w: torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.GELU(approximate="tanh")),
            ("weight", "bias"),
            native_owner="0",
        ),
    ]


def all_entries() -> list:
    import fused_ops

    entries = [_case_entry(c, _tiny_shape(c)) for c in harness.discover_cases()]
    return entries + extra_entries(fused_ops)


def select(entries, ops=None) -> list:
    """Entries whose name, op name (before '/') or case file is in ops (all if None)."""
    if not ops:
        return list(entries)
    want = set(ops)
    out = [e for e in entries if {e.name, e.name.split("/")[0], e.module} & want]
    if not out:
        raise ValueError(
            f"no op matches {sorted(want)}; known: {', '.join(e.name for e in entries)}"
        )
    return out


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------


class HostTimer:
    """Times single calls on the host. On CUDA each batch runs behind a spin kernel that
    keeps the GPU busy (see the module's docstring); on CPU the calls run as they are."""

    clock = staticmethod(time.perf_counter)
    FIRST_SPIN_US = 2000.0  # without a warm-up to size it on (see measure_pair)

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.gpu_idle_batches = 0
        self.spin_us = self.FIRST_SPIN_US

    def batch(self, step, calls: int) -> list:
        """Host microseconds of each of `calls` calls of step."""
        times = []
        busy = None
        if self.cuda:
            torch.cuda._sleep(int(self.spin_us * CYCLES_PER_US))
            busy = torch.cuda.Event()
            busy.record()  # completes when the spin ends
        for _ in range(calls):
            t0 = self.clock()
            step()
            times.append((self.clock() - t0) * 1e6)
        if self.cuda:
            # The next spin: 3x this batch's typical host time (6x after a batch that
            # outlasted its spin). From the median call, not the sum: an op that
            # synchronises waits out the whole spin in its first call, and a spin sized on
            # that would grow without end.
            need = BATCH * statistics.median(times) + 100
            if busy.query():  # the spin ended before the last call was enqueued
                self.gpu_idle_batches += 1
                need *= 2
            self.spin_us = min(max(self.spin_us, 3 * need), 500_000.0)
            torch.cuda.synchronize(self.device)
        return times


def measure_pair(steps: dict, timer: HostTimer, calls: int, warmup: int = 50) -> dict:
    """{impl: [host µs of every call]} for {impl: step}: warm-up calls first, then batches
    of BATCH calls taking turns in a rotating order until each has `calls` calls."""
    warm = []
    for step in steps.values():
        for _ in range(warmup):
            t0 = timer.clock()
            step()
            warm.append((timer.clock() - t0) * 1e6)
    if timer.cuda:
        torch.cuda.synchronize(timer.device)
    # The first spin sized on the warm-up calls, as HostTimer.batch sizes the later ones
    # (anew for each op: a long one's spin would slow the short ones' batches).
    timer.spin_us = 3 * (BATCH * statistics.median(warm) + 100) if warm else HostTimer.FIRST_SPIN_US
    gc.collect()
    names = list(steps)
    out = {n: [] for n in names}
    rounds = -(-calls // BATCH)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            out[name] += timer.batch(steps[name], min(BATCH, calls - len(out[name])))
    return out


def _summary(times) -> dict:
    q = statistics.quantiles(times, n=10) if len(times) >= 10 else [min(times), max(times)]
    return {
        "host_us": statistics.median(times),
        "host_mean_us": statistics.fmean(times),
        "host_min_us": min(times),
        "host_p10_us": q[0],
        "host_p90_us": q[-1],
        "calls": len(times),
    }


def run_entry(
    entry: Entry, pass_: str, rows: int, width: int, dtype, device, timer, calls: int, env: dict
) -> list:
    """The fused and native records of one entry and pass (an error is recorded, not
    raised)."""
    shape = (
        list(entry.extra["shape_of"](rows, width)) if "shape_of" in entry.extra else [rows, width]
    )
    base = {
        "op": entry.name.split("/")[0],
        "variant": entry.name.partition("/")[2],
        "bench": "host_time",
        "pass": pass_,
        "shape": shape,
        "dtype": harness.dtype_name(dtype),
        "host_us": None,
        "error": None,
        **env,
    }
    records = {impl: dict(base, impl=impl) for impl in ("fused", "native")}
    steps = {}
    try:
        torch.manual_seed(0)
        inputs = entry.make_inputs(rows, width, dtype, device)
        if pass_ == "fwd+bwd":
            for n in entry.grad_inputs:
                if isinstance(inputs[n], torch.nn.Parameter):
                    inputs[n].requires_grad_(True)  # in place: a module holds it
                else:
                    inputs[n] = inputs[n].detach().requires_grad_(True)
        for impl in records:
            steps[impl] = harness.make_step(entry.impls[impl], inputs, pass_, entry.grad_inputs)
        times = measure_pair(steps, timer, calls)
    except Exception as e:  # noqa: BLE001 - record it and go on with the other rows
        msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        for rec in records.values():
            rec["error"] = msg[:300]
        return list(records.values())
    for impl, rec in records.items():
        rec.update(_summary(times[impl]))
    add_ratio(records["fused"], records["native"])
    return list(records.values())


def add_ratio(fused: dict, native: dict) -> None:
    """host_ratio_vs_native = fused / native host µs (the issue's direction: <= target is
    met), with the pass's target and whether it is met, on the fused record."""
    target = TARGETS.get(fused["pass"])
    ok = fused.get("host_us") and native.get("host_us")
    ratio = fused["host_us"] / native["host_us"] if ok else None
    fused.update(
        host_ratio_vs_native=ratio,
        target=target,
        meets_target=None if ratio is None or target is None else ratio <= target,
    )


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------


def _label(rec) -> str:
    return f"{rec['op']}/{rec['variant']}" if rec.get("variant") else rec["op"]


def table(records: list) -> str:
    """op | pass | fused µs | native µs | ratio | target | meets, one row per op and pass."""
    rows = []
    pairs = {}
    for r in records:
        pairs.setdefault((_label(r), r["pass"]), {})[r["impl"]] = r
    for (label, pass_), by in pairs.items():
        f, n = by.get("fused", {}), by.get("native", {})
        ratio = f.get("host_ratio_vs_native")
        meets = f.get("meets_target")
        rows.append(
            [
                label,
                pass_,
                _us(f.get("host_us")),
                _us(n.get("host_us")),
                "–" if ratio is None else f"{ratio:.2f}",
                f"≤ {TARGETS[pass_]:.1f}" if pass_ in TARGETS else "–",
                "err: " + f["error"].replace("|", "/")
                if f.get("error")
                else "–"
                if meets is None
                else ("yes" if meets else "**no**"),
            ]
        )
    header = ["op", "pass", "fused µs", "native µs", "ratio", "target", "meets"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---:|---:|---:|---:|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _us(v) -> str:
    return "–" if v is None else f"{v:.1f}"


def summary_line(records: list) -> str:
    fused = [r for r in records if r["impl"] == "fused" and r.get("meets_target") is not None]
    met = sum(r["meets_target"] for r in fused)
    errs = sum(1 for r in records if r["impl"] == "fused" and r.get("error"))
    line = f"{met} of {len(fused)} op/pass rows meet the target (ratio = fused / native host µs)"
    return line + (f"; {errs} failed" if errs else "")


def header_text(header: dict) -> str:
    return (
        f"Host time per call, {header['device']} ({header['method']}); torch "
        f"{header['torch']}; shape {header['rows']}x{header['width']} "
        f"{header['dtype']}; median of {header['calls']} calls per cell. "
        f"Targets: fused / native ≤ 1.0 (fwd), ≤ 1.1 (fwd+bwd)."
    )


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--dtype", help="bf16, fp16 or fp32 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--shape", default="16x256", help="rows x width (default 16x256)")
    p.add_argument(
        "--ops",
        help="comma-separated names (layer_norm, gelu/tanh, nn.LayerNorm, "
        "a case file such as norm); default: all",
    )
    p.add_argument("--passes", default="fwd,fwd+bwd", help="fwd, fwd+bwd or both")
    p.add_argument(
        "--calls",
        type=int,
        default=2000,
        help="timed calls per implementation and pass (default 2000)",
    )
    p.add_argument("--out", default="bench_out/host_time.json", help="JSON output path")
    p.add_argument("--md", help="also write the markdown table to this path")
    p.add_argument(
        "--strict", action="store_true", help="exit 1 when a row misses its target or fails"
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    try:
        rows, width = harness.parse_shape(args.shape)
        dtypes = harness.parse_dtypes(args.dtype) if args.dtype else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    passes = [s.strip() for s in args.passes.split(",") if s.strip()]
    if not passes or set(passes) - set(PASSES):
        print(f"error: --passes takes {', '.join(PASSES)}", file=sys.stderr)
        return 2
    if args.calls < 1:
        print("error: --calls must be at least 1", file=sys.stderr)
        return 2
    if device.type == "cuda":
        harness.require_cuda("--device cuda (use --device cpu)")
        harness.import_fused_ops()
    else:
        import fused_ops  # noqa: F401 - registers the ops (CPU kernels)

        # One intra-op thread: tiny tensors gain nothing from more, and a thread pool
        # waiting on cores that other processes hold would be timed as the op's.
        torch.set_num_threads(1)
    dtype = dtypes[0] if dtypes else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    try:
        entries = select(
            all_entries(), [s.strip() for s in args.ops.split(",")] if args.ops else None
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    env = {
        "device": (
            torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else f"cpu ({platform.processor() or platform.machine()})"
        ),
        "torch": torch.__version__.split("+")[0],
    }
    method = (
        "GPU held busy by a spin kernel per batch of calls"
        if device.type == "cuda"
        else "CPU tensors, CPU kernels included"
    )
    timer = HostTimer(device)
    records = []
    for entry in entries:
        for pass_ in passes:
            if pass_ not in entry.passes:
                continue
            print(f"  {entry.name} {pass_}", file=sys.stderr)
            records += run_entry(entry, pass_, rows, width, dtype, device, timer, args.calls, env)
    header = {
        **env,
        "method": method,
        "rows": rows,
        "width": width,
        "dtype": harness.dtype_name(dtype),
        "calls": args.calls,
        "gpu_idle_batches": timer.gpu_idle_batches,
        "argv": sys.argv[1:],
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "python": platform.python_version(),
    }
    text = "\n".join([header_text(header), "", table(records), "", summary_line(records)])
    print(text)
    if timer.gpu_idle_batches:
        print(
            f"note: in {timer.gpu_idle_batches} batches the GPU went idle before the host "
            f"finished (the spin was lengthened after each)",
            file=sys.stderr,
        )
    report.write_json(args.out, header, records)
    if args.md:
        os.makedirs(os.path.dirname(os.path.abspath(args.md)), exist_ok=True)
        with open(args.md, "w") as f:
            f.write(f"# Host time per call: fused_ops vs native\n\n{text}\n")
    print(f"wrote {args.out}" + (f" and {args.md}" if args.md else ""), file=sys.stderr)
    bad = [
        r
        for r in records
        if r["impl"] == "fused" and (r.get("error") or r.get("meets_target") is False)
    ]
    return 1 if args.strict and bad else 0


if __name__ == "__main__":
    sys.exit(main())
