"""Does the harness's L2 flush charge its own write-backs to the op it times?

The Timer flushes the L2 cache before every repetition by writing a buffer twice the L2's
size (`flush_buf.fill_(1)`, as triton's do_bench zeroes one). That leaves the L2 full of
dirty lines, which the timed op then has to write back to DRAM as its own reads and
writes evict them. Two other ways to start each repetition with its inputs out of L2:
- `read`: a flush that only reads the buffer. It evicts as much but leaves clean lines,
  so the op pays no write-back but the one of its own lines it evicts itself; the output
  still in L2 when it ends is never charged (an undercount, as `write` overcharges).
- `rotate`: no flush. The op runs on K sets of inputs in turn (K sets span 4x the L2, so a
  set is cold when its turn comes) and the outputs of the last K repetitions are kept
  alive (so the next output is new memory, not the lines just written). Each repetition
  then writes back what the previous one left dirty: an op's own share, as in a model.

    python tools/flush_kind.py sizes                     # copy / x + y, all three
    python tools/flush_kind.py run read|rotate ARGS...   # benchmarks/run.py ARGS

`sizes` times, in one process and alternating, each tensor size under each way, against
one 1 GiB copy ceiling (harness flush). `run` is benchmarks/run.py with the read flush or
the rotation everywhere (its ceilings keep the harness's flush).
"""

import itertools
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from benchmarks import harness  # noqa: E402

MIB = 2**20


class ReadFlushTimer(harness.Timer):
    """The harness's Timer with a flush that reads its buffer instead of writing it."""

    def flush(self):
        self.flush_buf.sum(dtype=torch.int64)


class NoFlushTimer(harness.Timer):
    """The harness's Timer without a flush: the steps bring their own cold inputs."""

    def flush(self):
        pass


def rotation(sets: int, make):
    """A step running make(i) for i = 0, 1, ... in turn over `sets` prepared steps, keeping
    each step's result alive until its slot comes round again (the next output is then
    allocated beside the live ones, not on the lines just written)."""
    steps = [make(i) for i in range(sets)]
    kept = [None] * sets
    turn = itertools.count()

    def step():
        i = next(turn) % sets
        kept[i] = steps[i]()  # the old result lives until the new one is written
        return kept[i]

    return step


def sets_for(nbytes: int) -> int:
    """Input sets of nbytes each that together span 4x the L2 (at least 2)."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return max(2, -(-4 * l2 // max(nbytes, 1)))


def sizes():
    harness.require_cuda("flush_kind")
    timers = {
        "write": harness.Timer(budget_ms=20),
        "read": ReadFlushTimer(budget_ms=20),
        "rotate": NoFlushTimer(budget_ms=20),
    }
    ceil = harness.measure_ceilings(timers["write"])["copy_gbps"]
    print(
        f"{torch.cuda.get_device_name()}: ceiling {ceil:,.0f} GB/s (1 GiB copy, "
        f"harness flush); L2 flush buffer {timers['write'].flush_bytes / MIB:.0f} MiB"
    )
    print(
        f"{'bytes a tensor':>15} {'flush':>6} {'copy us':>9} {'copy %':>7} {'x+y us':>9} "
        f"{'x+y %':>7}"
    )
    for mib in [16, 32, 48, 64, 96, 128, 256]:
        n = mib * MIB // 2
        k = sets_for(2 * n * 2)
        src = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(k)]
        other = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(k)]
        copy = lambda i: lambda: src[i].clone()  # noqa: E731 - a new output each time
        add = lambda i: lambda: torch.add(src[i], other[i])  # noqa: E731
        pct = lambda t, tensors: tensors * n * 2 / (t * 1e-6) / 1e9 / ceil * 100  # noqa: E731
        for _ in range(2):  # two rounds, the ways alternated
            for kind, timer in timers.items():
                sets = k if kind == "rotate" else 1
                t_copy = timer.measure(rotation(sets, copy))["median_us"]
                t_add = timer.measure(rotation(sets, add))["median_us"]
                print(
                    f"{mib:>11} MiB {kind:>6} {t_copy:>9.1f} {pct(t_copy, 2):>7.1f} "
                    f"{t_add:>9.1f} {pct(t_add, 3):>7.1f}",
                    flush=True,
                )
        del src, other


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("sizes", "run"):
        sys.exit(__doc__)
    if sys.argv[1] == "sizes":
        sizes()
        return
    if len(sys.argv) < 3 or sys.argv[2] not in ("read", "rotate"):
        sys.exit(__doc__)
    from benchmarks import run

    base, ceilings = harness.Timer, harness.measure_ceilings
    # run.py builds its Timer through the module; its ceilings keep the harness's flush.
    harness.measure_ceilings = lambda timer: ceilings(base(budget_ms=timer.budget_ms))
    if sys.argv[2] == "read":
        harness.Timer = ReadFlushTimer
    else:
        harness.Timer = NoFlushTimer
        rotate_inputs()
    sys.exit(run.main(sys.argv[3:]))


def rotate_inputs():
    """run_plan's inputs as K sets and its steps rotating over them (see rotation)."""
    make_inputs, make_step = harness.make_inputs, harness.make_step

    def many_inputs(case, shape, dtype, pass_, device="cuda", seed=0):
        first = make_inputs(case, shape, dtype, pass_, device, seed)
        nbytes = sum(t.nbytes for t in first.values() if isinstance(t, torch.Tensor))
        k = sets_for(nbytes)
        return [first] + [
            make_inputs(case, shape, dtype, pass_, device, seed + i) for i in range(1, k)
        ]

    def rotating_step(fn, inputs, pass_, grad_names=(), seed=1):
        return rotation(len(inputs), lambda i: make_step(fn, inputs[i], pass_, grad_names, seed))

    harness.make_inputs, harness.make_step = many_inputs, rotating_step


if __name__ == "__main__":
    main()
