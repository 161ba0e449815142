"""The benchmark harness: the Case interface, case discovery, timing and the ceilings.

Each op adds one file, benchmarks/cases/<op>.py, with a list CASES of Case entries; the
harness imports every module in benchmarks/cases and measures each case as

    fused / native / unfused (from the case)  +  compile = torch.compile(impls["unfused"])

for every shape, dtype and pass ("fwd"; "fwd+bwd" timed together; "bwd": the backward
alone, of a forward run once outside the timed step). Reporting (tables,
JSON, plots) lives in benchmarks/report.py; the command line in benchmarks/run.py.

How a measurement is taken (see Timer.measure):
  - inputs are random (the case's make_inputs), the same tensors for every impl;
  - warm-up calls first (for "compile" these also compile);
  - the L2 cache is flushed before every repetition by writing a buffer twice its size, so
    every repetition reads its inputs from HBM, as a large tensor in a real model would;
  - each repetition is bracketed by CUDA events; the repetitions are queued back to back
    (one synchronisation at the end), so host launch latency hides behind the flush;
  - the repetition count adapts to a time budget (at least `min_reps`); the median is kept;
  - with rounds > 1 (run.py --rounds) the implementations of a group are warmed up first,
    then timed in rounds of 1/rounds of their repetitions, in a rotating order, so a drift
    of the GPU's clocks during the group does not favour the one timed first (run_plan).

Two figures per record, and the tables say which they show:
  - median_us, the GPU time (above): host launch overhead is hidden, so it is what the
    kernels cost;
  - wall_us, the wall-clock time (Timer.wall_clock): no spin kernel, no L2 flush, calls
    issued back to back as a model issues them, from the first launch to the
    synchronisation after the last, divided by the calls; median of WALL_BATCHES batches.
    It is what a user waits for: max(GPU time, host time) per call, roughly, so on small
    shapes (the decode rows, DECODE_SHAPES) it is the host time of the Python and C++
    layers above the kernel. Inputs stay in L2 between calls when they fit, as in a model
    whose next op reads what the previous one wrote.
  - host_us (from the warm-up) is the host time to enqueue one flush + step alone.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch._functorch.config  # make_step's bwd pass; not imported by `import torch`

# Every pass the harness can time, and the ones a Case gets unless it lists its own.
PASSES = ("fwd", "fwd+bwd", "bwd")
DEFAULT_PASSES = ("fwd", "fwd+bwd")
# Short and long dtype names accepted on the command line; records use the long name.
DTYPE_NAMES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "fp64": torch.float64,
    "float64": torch.float64,
}
# Column order of the implementations; "compile" is added by the harness.
IMPL_ORDER = ("fused", "native", "unfused", "compile")
# Decoding rows (batch 1, 16 and 128 tokens of a 4096-wide model): the shapes where host
# time, not bandwidth, sets the wall-clock time. Every memory-bound case measures them.
DECODE_SHAPES = [(1, 4096), (16, 4096), (128, 4096)]


@dataclass
class Case:
    """One benchmarked op (or variant of an op): the interface every
    benchmarks/cases/<op>.py file writes against (see benchmarks/cases/gelu.py).

    op:           op name as in torch.ops.fused ("layer_norm")
    variant:      shown in the table and JSON ("tanh", "causal", "residual", or "")
    shapes:       each passed to make_inputs
    quick_shapes: used by --quick (default: the first shape)
    dtypes:       dtypes measured (default bf16, fp16, fp32)
    passes:       subset of PASSES ("fwd", "fwd+bwd", "bwd"); default ("fwd", "fwd+bwd")
    make_inputs:  (shape, dtype, device) -> dict of named tensors, random (never zeros)
    grad_inputs:  names of the inputs that require grad in the fwd+bwd and bwd passes
    impls:        name -> fn(**inputs) returning a Tensor or a tuple of Tensors;
                  "fused", "native", "unfused" expected, extra competitors welcome
    bytes:        (shape, dtype, pass_) -> the MINIMUM bytes the pass must move
                  ("bwd": the backward's own, i.e. fwd+bwd's less the forward's)
    flops:        None, or (shape, pass_) -> FLOPs, for compute-bound ops (reported in
                  TFLOP/s against the matmul ceiling instead of GB/s against the copy)
    fwd_only:     names of implementations with no backward (e.g. cuBLASLt's fused
                  epilogue, which autograd cannot differentiate): measured in "fwd" only
    fields:       extra fields copied into every record of the case (e.g. the operand
                  layout of a GEMM); the key "sum" names a group whose records also get a
                  summed-time row (summed_records)
    """

    op: str
    variant: str = ""
    shapes: list = None
    quick_shapes: list = None
    dtypes: list = None
    passes: tuple = DEFAULT_PASSES
    make_inputs: Callable = None
    grad_inputs: tuple = ()
    impls: dict = None
    bytes: Callable = None
    flops: Optional[Callable] = None
    fwd_only: tuple = ()
    fields: dict = None

    def __post_init__(self):
        for name in ("shapes", "make_inputs", "impls", "bytes"):
            if getattr(self, name) is None:
                raise TypeError(
                    f"Case(op={self.op!r}, variant={self.variant!r}): '{name}' is required"
                )
        self.shapes = [tuple(s) for s in self.shapes]
        self.quick_shapes = [tuple(s) for s in (self.quick_shapes or self.shapes[:1])]
        if self.dtypes is None:
            self.dtypes = [torch.bfloat16, torch.float16, torch.float32]
        self.passes = tuple(self.passes)
        bad = [p for p in self.passes if p not in PASSES]
        if bad:
            raise ValueError(f"Case(op={self.op!r}): unknown pass {bad}; use {PASSES}")
        self.grad_inputs = tuple(self.grad_inputs)
        self.fwd_only = tuple(self.fwd_only)
        self.fields = dict(self.fields or {})
        unknown = [n for n in self.fwd_only if n not in self.impl_names()]
        if unknown:
            raise ValueError(f"Case(op={self.op!r}): fwd_only names unknown impls {unknown}")

    @property
    def label(self) -> str:
        return f"{self.op}/{self.variant}" if self.variant else self.op

    def impl_names(self) -> list:
        """The implementations measured, in table order: the known ones, then extras."""
        names = list(self.impls)
        if "unfused" in self.impls:
            names.append("compile")
        known = [n for n in IMPL_ORDER if n in names]
        return known + [n for n in names if n not in IMPL_ORDER]


# ---------------------------------------------------------------------------------------
# Discovery and command-line parsing (pure Python: unit-tested without a GPU)
# ---------------------------------------------------------------------------------------


def discover_cases(package: str = "benchmarks.cases", warn=None) -> list:
    """Import every module of `package` and collect their CASES lists, in module order.

    Each Case gets a `module` attribute (the file's name) so --ops can select by file too.
    A module that fails to import is reported through `warn` (stderr by default) and
    skipped, so one broken case file does not stop the others from being measured.
    """
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    pkg = importlib.import_module(package)
    cases = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        try:
            mod = importlib.import_module(f"{package}.{info.name}")
        except Exception as e:  # noqa: BLE001 - report and go on with the other files
            warn(
                f"warning: skipping benchmarks/cases/{info.name}.py: "
                f"{type(e).__name__}: {e}".splitlines()[0]
            )
            continue
        for case in getattr(mod, "CASES", []):
            case.module = info.name
            cases.append(case)
    return cases


def parse_shape(text: str) -> tuple:
    """'16384x4096' -> (16384, 4096)."""
    try:
        dims = tuple(int(d) for d in text.lower().strip().split("x"))
    except ValueError:
        raise ValueError(
            f"bad shape {text!r}: expected sizes joined by 'x', e.g. 16384x4096"
        ) from None
    if not dims or any(d < 0 for d in dims):
        raise ValueError(f"bad shape {text!r}: expected sizes joined by 'x', e.g. 16384x4096")
    return dims


def parse_shapes(text: str) -> list:
    """'16384x4096,4096x32768' -> [(16384, 4096), (4096, 32768)]."""
    return [parse_shape(s) for s in text.split(",") if s.strip()]


def parse_dtypes(text: str) -> list:
    out = []
    for name in (s.strip().lower() for s in text.split(",") if s.strip()):
        if name not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype {name!r}: use bf16, fp16, fp32")
        out.append(DTYPE_NAMES[name])
    return out


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def shape_str(shape) -> str:
    return "x".join(str(d) for d in shape)


def sanitize_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (a safe file name)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-gpu"


@dataclass
class Plan:
    """What one run measures: one entry per (case, shape, dtype, pass)."""

    case: Case
    shape: tuple
    dtype: torch.dtype
    pass_: str
    impls: list


def select(cases, ops=None, shapes=None, dtypes=None, passes=None, impls=None, quick=False) -> list:
    """Expand the cases into measurement groups, filtered by the command-line options.

    ops:    names matched against the case's op, its op/variant label, or its file name.
    shapes: replace each case's shapes by those given with a number of dims the case
            uses (a case with none of those ranks is left out).
    quick:  each case's quick_shapes, bf16 only.
    """
    plans = []
    for case in cases:
        if ops and not ({case.op, case.label, getattr(case, "module", None)} & set(ops)):
            continue
        case_shapes = case.quick_shapes if quick else case.shapes
        if shapes:
            ranks = {len(s) for s in case.shapes}
            case_shapes = [s for s in shapes if len(s) in ranks]
        case_dtypes = list(case.dtypes)
        if dtypes:
            case_dtypes = [d for d in case_dtypes if d in dtypes]
        elif quick:
            case_dtypes = [d for d in case_dtypes if d == torch.bfloat16] or case_dtypes[:1]
        names = [n for n in case.impl_names() if not impls or n in impls]
        if not names:
            continue
        for shape in case_shapes:
            for dtype in case_dtypes:
                for pass_ in case.passes:
                    if passes and pass_ not in passes:
                        continue
                    measured = [n for n in names if pass_ == "fwd" or n not in case.fwd_only]
                    plans.append(Plan(case, tuple(shape), dtype, pass_, measured))
    return plans


# ---------------------------------------------------------------------------------------
# Building the timed step
# ---------------------------------------------------------------------------------------


def as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def pass_bytes(pass_: str, fwd, bwd):
    """A case's bytes for `pass_`, from its forward's and its backward's own."""
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[pass_]


def make_compiled(case: Case):
    """torch.compile of the unfused composition, specialised to each shape (dynamic=False).

    The compile cache is reset before each measurement (see run_plan), so the compile
    implementation never pays for guard checks against other shapes' entries, and the
    recompile limit is never reached."""
    return torch.compile(case.impls["unfused"], dynamic=False)


def make_inputs(case: Case, shape, dtype, pass_, device="cuda", seed=0):
    """Random inputs for one measurement group; grad_inputs become leaves requiring grad
    in the fwd+bwd and bwd passes."""
    torch.manual_seed(seed)
    inputs = dict(case.make_inputs(shape, dtype, device))
    if pass_ in ("fwd+bwd", "bwd"):
        for name in case.grad_inputs:
            inputs[name] = inputs[name].detach().requires_grad_(True)
    return inputs


def _donation(pass_: str):
    """AOTAutograd's donated buffers on, except for the bwd pass (see make_step)."""
    return torch._functorch.config.patch(donated_buffer=pass_ != "bwd")


def make_step(fn, inputs, pass_, grad_names=(), seed=1):
    """Return a zero-argument callable running one repetition of the pass.

    fwd:     fn(**inputs).
    fwd+bwd: fn(**inputs), then torch.autograd.grad of the differentiable outputs with
             random output gradients prepared here (one untimed call finds their shapes).
             autograd.grad returns the input gradients instead of accumulating them into
             .grad, so no implementation pays for an accumulation or a reset.
    bwd:     the same torch.autograd.grad on the outputs of one forward run here, outside
             the step (its graph retained for every repetition): the backward alone, as
             the issues' backward targets count it. The retained graph lives as long as the
             step (with --rounds, every implementation's at once); peak_mem_bytes counts
             what the backward allocates on top of it. A compiled fn is compiled and
             differentiated here without AOTAutograd's donated buffers (saved tensors its
             backward may overwrite), which forbid retain_graph; they save memory, not time.
    """
    if pass_ == "fwd":
        return lambda: fn(**inputs)
    leaves = [inputs[n] for n in grad_names if inputs[n].requires_grad]
    with _donation(pass_):  # a compiled fn compiles on this first call
        outs = as_tuple(fn(**inputs))
    diff = [i for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad]
    if not diff or not leaves:
        raise RuntimeError(f"{pass_}: no differentiable output or no input requiring grad")
    gen = torch.Generator(device=outs[diff[0]].device).manual_seed(seed)
    grads = [
        torch.randn(outs[i].shape, generator=gen, device=outs[i].device, dtype=torch.float32).to(
            outs[i].dtype
        )
        for i in diff
    ]
    if pass_ == "bwd":
        kept = [outs[i] for i in diff]

        def backward():
            with _donation(pass_):
                return torch.autograd.grad(
                    kept, leaves, grads, retain_graph=True, allow_unused=True
                )

        return backward
    del outs

    def step():
        o = as_tuple(fn(**inputs))
        return torch.autograd.grad([o[i] for i in diff], leaves, grads, allow_unused=True)

    return step


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------


class Timer:
    """Times a step with CUDA events, flushing the L2 cache before every repetition."""

    def __init__(self, device="cuda", budget_ms=100.0, min_reps=10, max_reps=2000, warmup_ms=25.0):
        self.device = torch.device(device)
        props = torch.cuda.get_device_properties(self.device)
        # Writing twice the L2 size evicts everything the previous repetition left there.
        l2 = getattr(props, "L2_cache_size", 0) or 64 * 2**20
        self.flush_bytes = max(2 * l2, 32 * 2**20)
        self.flush_buf = torch.empty(self.flush_bytes // 4, dtype=torch.int32, device=self.device)
        self.budget_ms, self.min_reps, self.max_reps = budget_ms, min_reps, max_reps
        self.warmup_ms = warmup_ms

    def flush(self):
        self.flush_buf.fill_(1)

    # Launches a chunk may queue before the host blocks on CUDA's launch queue (~1024
    # entries; a repetition is a flush, two events and the step's kernels).
    CHUNK = 64
    # Spin-kernel cycles per microsecond; ~2 GHz SM clocks on H100/H200. A slower clock only
    # lengthens the hold-back, which is harmless.
    CYCLES_PER_US = 2000

    def timed(self, step, reps, host_us):
        """Times `reps` repetitions, in chunks. Before each chunk the GPU is held back by a
        spin kernel long enough for the host to enqueue the whole chunk, so host-side
        launch overhead (Python autograd, the dispatcher) never shows as GPU idle time
        inside a timed region: these are device times."""
        times = []
        for first in range(0, reps, self.CHUNK):
            n = min(self.CHUNK, reps - first)
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            torch.cuda._sleep(int(min(n * host_us * 1.5 + 50, 500_000) * self.CYCLES_PER_US))
            for i in range(n):
                self.flush()
                starts[i].record()
                step()
                ends[i].record()
            torch.cuda.synchronize(self.device)
            times += [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]  # microseconds
        return times

    def sync(self):
        torch.cuda.synchronize(self.device)

    # Wall-clock mode: the batches of back-to-back calls per implementation (the median is
    # kept), and the share of budget_ms they spend together.
    WALL_BATCHES = 5
    WALL_SHARE = 0.5
    clock = staticmethod(time.perf_counter)

    def wall_calls(self, estimate_us: float) -> int:
        """Calls in one wall-clock batch: the batch's share of the budget over the per-call
        estimate (max of GPU and host time), clamped to min_reps..max_reps."""
        batch_us = self.budget_ms * 1e3 * self.WALL_SHARE / self.WALL_BATCHES
        n = int(batch_us / max(estimate_us, 1.0))
        return max(self.min_reps, min(self.max_reps, n))

    def wall_clock(self, step, calls: int) -> float:
        """Microseconds per call of `calls` back-to-back calls of step, as a user sees them:
        no spin kernel holding the GPU back and no L2 flush, timed on the host from the
        first launch to the synchronisation after the last (the GPU is idle at the start)."""
        self.sync()
        t0 = self.clock()
        for _ in range(calls):
            step()
        self.sync()
        return (self.clock() - t0) * 1e6 / calls

    def warm_up(self, step) -> dict:
        """Everything before the timed repetitions: the first call (compiles, allocates,
        loads modules), the host time to enqueue one flush + step, a 3-repetition estimate
        and from it the repetition count that fills the budget (min_reps to max_reps)."""
        step()
        self.sync()
        host = []  # host time to enqueue one flush + step
        t0 = time.perf_counter()
        while (time.perf_counter() - t0) * 1e3 < self.warmup_ms or len(host) < 3:
            t = time.perf_counter()
            self.flush()
            step()
            host.append((time.perf_counter() - t) * 1e6)
            self.sync()
        host_us = statistics.median(host)
        estimate_us = statistics.median(self.timed(step, 3, host_us))
        reps = int(self.budget_ms * 1e3 / max(estimate_us, 1.0))
        return {"host_us": host_us, "reps": max(self.min_reps, min(self.max_reps, reps))}

    @staticmethod
    def summary(times, host_us) -> dict:
        """Median/min/max in microseconds of the repetition times, and their count."""
        return {
            "median_us": statistics.median(times),
            "min_us": min(times),
            "max_us": max(times),
            "reps": len(times),
            "host_us": host_us,
        }

    def measure(self, step) -> dict:
        """Warm up, estimate one repetition, then time enough repetitions for the budget.
        Returns median/min/max in microseconds and the repetition count."""
        warm = self.warm_up(step)
        return self.summary(self.timed(step, warm["reps"], warm["host_us"]), warm["host_us"])

    def peak_memory(self, step) -> int:
        """Bytes allocated at the peak of one repetition above what existed before it
        (inputs, output gradients and the flush buffer are excluded)."""
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        out = step()
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - base
        del out
        return int(peak)

    def held_memory(self, forward) -> int:
        """Bytes still allocated after a forward call while its outputs are alive: the
        outputs plus whatever autograd saved for the backward (e.g. a dropout mask)."""
        torch.cuda.synchronize(self.device)
        base = torch.cuda.memory_allocated(self.device)
        out = forward()
        torch.cuda.synchronize(self.device)
        held = torch.cuda.memory_allocated(self.device) - base
        del out
        return int(held)


def measure_ceilings(timer: Timer, copy_bytes: int = 2**30, mm_n: int = 8192) -> dict:
    """The run's own ceilings: a large device-to-device copy (bytes read + bytes written)
    and a large bf16 torch.mm on random data."""
    device = timer.device
    free, _total = torch.cuda.mem_get_info(device)
    copy_bytes = int(min(copy_bytes, free // 4))
    src = torch.randint(0, 2**31 - 1, (copy_bytes // 4,), dtype=torch.int32, device=device)
    dst = torch.empty_like(src)
    t = timer.measure(lambda: dst.copy_(src))
    copy_gbps = 2 * src.numel() * 4 / (t["median_us"] * 1e-6) / 1e9
    del src, dst
    a = torch.randn(mm_n, mm_n, device=device, dtype=torch.bfloat16)
    b = torch.randn(mm_n, mm_n, device=device, dtype=torch.bfloat16)
    t = timer.measure(lambda: torch.mm(a, b))
    mm_tflops = 2 * mm_n**3 / (t["median_us"] * 1e-6) / 1e12
    del a, b
    torch.cuda.empty_cache()
    return {
        "copy_gbps": copy_gbps,
        "copy_bytes": 2 * (copy_bytes // 4) * 4,
        "mm_tflops": mm_tflops,
        "mm_shape": [mm_n, mm_n, mm_n],
    }


def rates(case: Case, shape, dtype, pass_, median_us, ceilings) -> dict:
    """GB/s (or TFLOP/s for compute-bound cases) and % of the matching ceiling."""
    nbytes = int(case.bytes(shape, dtype, pass_))
    out = {"bytes": nbytes, "flops": None, "gbps": None, "tflops": None, "pct_of_peak": None}
    if median_us is None or median_us <= 0:
        return out
    out["gbps"] = nbytes / (median_us * 1e-6) / 1e9
    if case.flops is not None:
        out["flops"] = int(case.flops(shape, pass_))
        out["tflops"] = out["flops"] / (median_us * 1e-6) / 1e12
        if ceilings.get("mm_tflops"):
            out["pct_of_peak"] = out["tflops"] / ceilings["mm_tflops"] * 100
    elif ceilings.get("copy_gbps"):
        out["pct_of_peak"] = out["gbps"] / ceilings["copy_gbps"] * 100
    return out


def _short_error(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def interleave(reps: dict, rounds: int) -> list:
    """The timing schedule of one group: `rounds` lists of (impl, repetitions).

    reps maps each implementation, in table order, to the repetitions its budget asks for.
    Every implementation gets ceil(reps / rounds) repetitions in every round (so its total
    is its budget's count rounded up to a multiple of rounds), and round r starts at the
    implementation r % k (k of them) and goes on in table order, wrapping around: none is
    always timed first. rounds=1 is one block per implementation, in table order."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    names = list(reps)
    if not names:
        return []
    share = {n: max(1, -(-reps[n] // rounds)) for n in names}
    return [
        [(n, share[n]) for n in names[r % len(names) :] + names[: r % len(names)]]
        for r in range(rounds)
    ]


def run_plan(
    plan: Plan,
    timer: Timer,
    ceilings: dict,
    env: dict,
    on_impl=None,
    device="cuda",
    rounds: int = 1,
    wall: bool = True,
) -> list:
    """Measure every implementation of one (case, shape, dtype, pass) group.

    rounds=1 measures the implementations one after another, each warmed up and then timed
    for the whole budget. rounds=N > 1 warms every implementation up first, then times them
    in N rounds of 1/N of their repetitions each, in an order that rotates from round to
    round (see interleave): a drift of the GPU's clocks during the group then reaches every
    implementation alike instead of favouring the one timed first. The median and min are
    taken over all of an implementation's repetitions; its memory is measured after the
    rounds.

    wall=True also takes the wall-clock figure (wall_us, Timer.wall_clock) after the GPU
    timing: Timer.WALL_BATCHES batches per implementation, the implementations of a group
    taking turns batch by batch in a rotating order, as the rounds do.

    Returns one record per implementation. A failure (compile error, out of memory, an
    implementation that rejects the shape) is recorded in the record's "error" field, that
    implementation leaves the later rounds, and the run goes on."""
    case, shape, dtype, pass_ = plan.case, plan.shape, plan.dtype, plan.pass_
    inputs, input_error = None, None
    try:
        inputs = make_inputs(case, shape, dtype, pass_, device)
    except Exception as e:  # noqa: BLE001
        input_error = f"make_inputs failed: {_short_error(e)}"
    records = {
        impl: {
            "op": case.op,
            "variant": case.variant,
            "pass": pass_,
            "shape": list(shape),
            "dtype": dtype_name(dtype),
            "impl": impl,
            "median_us": None,
            "min_us": None,
            "reps": None,
            "rounds": rounds,
            "wall_us": None,
            "wall_min_us": None,
            "wall_calls": None,
            "peak_mem_bytes": None,
            "fwd_held_bytes": None,
            "error": None,
            **env,
            "ceiling_copy_gbps": ceilings.get("copy_gbps"),
            "ceiling_mm_tflops": ceilings.get("mm_tflops"),
            **case.fields,
        }
        for impl in plan.impls
    }

    def measure_group(group):
        live = {}  # impl -> (fn, step, warm-up result), until it fails
        for impl in group:
            if on_impl:
                on_impl(plan, impl)
            try:
                if inputs is None:
                    raise RuntimeError(input_error)
                if impl == "compile":
                    torch._dynamo.reset()  # once per group; the other steps leave dynamo be
                    fn = make_compiled(case)
                else:
                    fn = case.impls[impl]
                step = make_step(fn, inputs, pass_, case.grad_inputs)
                live[impl] = (fn, step, timer.warm_up(step))
            except Exception as e:  # noqa: BLE001 - record it and measure the rest
                records[impl]["error"] = _short_error(e)
        times = {impl: [] for impl in live}
        for round_ in interleave({impl: w["reps"] for impl, (_, _, w) in live.items()}, rounds):
            for impl, n in round_:
                if impl not in live:
                    continue  # failed in an earlier round
                _, step, warm = live[impl]
                try:
                    times[impl] += timer.timed(step, n, warm["host_us"])
                except Exception as e:  # noqa: BLE001
                    records[impl]["error"] = _short_error(e)
                    del live[impl]
        if wall:
            walls = measure_wall(
                {
                    impl: (step, max(statistics.median(times[impl]), warm["host_us"]))
                    for impl, (_, step, warm) in live.items()
                }
            )
        for impl, (fn, step, warm) in live.items():
            rec = records[impl]
            try:
                t = timer.summary(times[impl], warm["host_us"])
                rec.update(
                    median_us=t["median_us"],
                    min_us=t["min_us"],
                    reps=t["reps"],
                    host_us=t["host_us"],
                )
                if wall:
                    rec.update(walls[impl])
                rec["peak_mem_bytes"] = timer.peak_memory(step)
                if pass_ == "fwd+bwd":
                    rec["fwd_held_bytes"] = timer.held_memory(lambda: fn(**inputs))
            except Exception as e:  # noqa: BLE001 - kept beside a wall-clock failure
                rec["error"] = "; ".join(filter(None, (rec["error"], _short_error(e))))

    def measure_wall(steps):
        """{impl: wall_us, wall_min_us, wall_calls} for {impl: (step, per-call estimate)};
        a failure is recorded as the record's error (its GPU figures are kept)."""
        calls = {impl: timer.wall_calls(est) for impl, (_, est) in steps.items()}
        per_call = {impl: [] for impl in steps}
        for round_ in interleave({impl: timer.WALL_BATCHES for impl in steps}, timer.WALL_BATCHES):
            for impl, _ in round_:
                if impl not in per_call:
                    continue  # failed in an earlier batch
                try:
                    per_call[impl].append(timer.wall_clock(steps[impl][0], calls[impl]))
                except Exception as e:  # noqa: BLE001
                    records[impl]["error"] = f"wall clock: {_short_error(e)}"
                    del per_call[impl]
        return {
            impl: {
                "wall_us": statistics.median(v),
                "wall_min_us": min(v),
                "wall_calls": calls[impl] * len(v),
            }
            if impl in per_call
            else {}
            for impl, v in ((i, per_call.get(i, [])) for i in steps)
        }

    groups = [list(plan.impls)] if rounds > 1 else [[impl] for impl in plan.impls]
    for group in groups:
        measure_group(group)  # its steps are released on return
        if any("out of memory" in (records[i]["error"] or "").lower() for i in group):
            torch.cuda.empty_cache()  # let the next group start clean
    del inputs
    records = list(records.values())
    for rec in records:
        rec.update(rates(case, shape, dtype, pass_, rec["median_us"], ceilings))
    add_speedups(records)
    return records


def summed_records(records: list) -> list:
    """Summary rows for records carrying a "sum" field: per (op, sum group, pass, dtype), one
    record per implementation whose median_us (and wall_us) is the sum over the group's rows
    where every implementation has a time (so each sums the same GEMMs), its rate the summed
    FLOPs (or bytes) over that time; variant "sum of <group> (<n> rows)", shape []. The speed-ups
    then compare total times: the whole set as a training step runs it."""
    groups = {}
    for rec in records:
        if rec.get("sum") is None:
            continue
        key = (rec["op"], rec["sum"], rec["pass"], rec["dtype"])
        row = (rec.get("variant", ""), tuple(rec["shape"]))
        groups.setdefault(key, {}).setdefault(row, {})[rec["impl"]] = rec
    out = []
    for (op, name, pass_, dtype), rows in groups.items():
        impls = sorted({impl for by_impl in rows.values() for impl in by_impl})
        full = [
            by_impl
            for by_impl in rows.values()
            if all(by_impl.get(i) and by_impl[i].get("median_us") for i in impls)
        ]
        if not full:
            continue
        summed = []
        for impl in impls:
            recs = [by_impl[impl] for by_impl in full]
            first = recs[0]
            t = sum(r["median_us"] for r in recs)
            walls = [r.get("wall_us") for r in recs]
            flops = sum(r["flops"] for r in recs) if all(r.get("flops") for r in recs) else None
            nbytes = sum(r.get("bytes") or 0 for r in recs)
            rec = {
                k: first.get(k)
                for k in ("device", "torch", "torch_full", "cuda", "python", "rounds")
                if k in first
            }
            rec.update(
                op=op,
                variant=f"sum of {name} ({len(full)} rows)",
                shape=[],
                dtype=dtype,
                impl=impl,
                median_us=t,
                min_us=sum(r["min_us"] or 0 for r in recs),
                wall_us=sum(walls) if all(w is not None for w in walls) else None,
                error=None,
                bytes=nbytes,
                flops=flops,
                gbps=nbytes / (t * 1e-6) / 1e9,
                tflops=flops / (t * 1e-6) / 1e12 if flops else None,
                ceiling_copy_gbps=first.get("ceiling_copy_gbps"),
                ceiling_mm_tflops=first.get("ceiling_mm_tflops"),
                sum=name,
            )
            rec["pass"] = pass_
            ceiling = rec["ceiling_mm_tflops"] if flops else rec["ceiling_copy_gbps"]
            rate = rec["tflops"] if flops else rec["gbps"]
            rec["pct_of_peak"] = rate / ceiling * 100 if ceiling else None
            summed.append(rec)
        add_speedups(summed)
        out += summed
    return out


def add_speedups(records: list) -> None:
    """x_vs_native / x_vs_compile on every record of one group: how many times faster
    this implementation is than native PyTorch and than torch.compile, in GPU time
    (median_us); x_vs_native_wall / x_vs_compile_wall the same in wall-clock time (wall_us)."""
    for key, suffix in (("median_us", ""), ("wall_us", "_wall")):
        by_impl = {r["impl"]: r.get(key) for r in records}
        for r in records:
            for other in ("native", "compile"):
                base = by_impl.get(other)
                ok = base and r.get(key)
                r[f"x_vs_{other}{suffix}"] = base / r[key] if ok else None


def environment() -> dict:
    import platform

    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__.split("+")[0],
        "torch_full": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def configure_compile() -> None:
    """Room for one compiled graph per shape and dtype (each measurement resets anyway)."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 64))
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 4096))


class Progress:
    """A one-line progress bar on stderr (redrawn in place on a terminal; every ~10%
    as separate lines otherwise, so logs stay short)."""

    def __init__(self, total: int, stream=None, width: int = 30):
        self.total, self.done, self.width = max(total, 1), 0, width
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()
        self._last_decile = -1

    def update(self, label: str) -> None:
        frac = self.done / self.total
        filled = int(round(frac * self.width))
        elapsed = time.perf_counter() - self.t0
        line = (
            f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
            f"{elapsed:5.0f}s  {label}"
        )
        if self.tty:
            self.stream.write("\r\033[K" + line[:160])
            self.stream.flush()
        elif int(frac * 10) != self._last_decile:
            self._last_decile = int(frac * 10)
            self.stream.write(line + "\n")
            self.stream.flush()

    def step(self, label: str) -> None:
        self.update(label)
        self.done += 1

    def close(self) -> None:
        self.update("done")
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()


def total_measurements(plans) -> int:
    return sum(len(p.impls) for p in plans)


def require_cuda(what: str) -> None:
    """Exit 2 with one line on stderr when no CUDA GPU is usable."""
    if not torch.cuda.is_available():
        print(f"no CUDA GPU found: {what} needs one", file=sys.stderr)
        raise SystemExit(2)


def import_fused_ops() -> None:
    """Import fused_ops (registers torch.ops.fused); exit 2 with one line if it is not
    built, or built without its CUDA kernels."""
    try:
        import fused_ops
    except ImportError as e:
        print(f"cannot import fused_ops: {str(e).splitlines()[0]}", file=sys.stderr)
        raise SystemExit(2) from None
    if not fused_ops.WITH_CUDA:
        print(
            "fused_ops was built without its CUDA kernels (no CUDA toolkit at build "
            "time): rebuild with `make build` where nvcc is installed",
            file=sys.stderr,
        )
        raise SystemExit(2)


__all__ = [
    "Case",
    "Plan",
    "Timer",
    "PASSES",
    "DECODE_SHAPES",
    "pass_bytes",
    "discover_cases",
    "parse_shape",
    "parse_shapes",
    "parse_dtypes",
    "dtype_name",
    "shape_str",
    "sanitize_name",
    "select",
    "make_inputs",
    "make_step",
    "make_compiled",
    "measure_ceilings",
    "rates",
    "interleave",
    "run_plan",
    "environment",
    "configure_compile",
    "Progress",
    "total_measurements",
    "require_cuda",
    "import_fused_ops",
    "add_speedups",
    "summed_records",
]
