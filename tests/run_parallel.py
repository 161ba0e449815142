"""Runs the selected tests in several pytest processes at once and reports them together.

    python tests/run_parallel.py [--jobs N] [--paths tests/test_a.py,...] [--chunk N]
        [--shard K/N] [--tool memcheck|racecheck|synccheck|initcheck | --memcheck]
        [--kernels SUBSTRING]
        [pytest options, e.g. -m cuda or -k softmax; no paths]

The GPU suite (`-m cuda`, ~2000 tests) takes over 7 minutes in one process on an H100 and
~2.5 in eight: most of a test's time is the host's (float64 references, torch dispatch,
compiling), which the processes share out while the GPU runs their kernels side by side.
The tests are collected once and dealt round-robin into chunks (a test's inputs come from its
own node id, tests/conftest.py, so the split changes nothing); at most --jobs chunks run at a
time, each in a fresh pytest process with OMP_NUM_THREADS = cores / jobs so their CPU work
does not oversubscribe the machine. Each chunk's log goes to build/test_logs/; its result is
printed as it ends, and the summary lists every failure. Exit status 0 only when every chunk
passed.

--tool runs each chunk under `compute-sanitizer --tool <tool>` (--memcheck is --tool memcheck)
with torch's caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): each tensor is then its
own allocation, so a read past its end is reported rather than landing in a cached
neighbour's bytes. CUDA graph capture, the CUDA profiler and the allocator's statistics do not
work there, so the tests that need them skip (tests/utils.py, skip_under_memcheck); the plain
run checks them. A chunk fails on any sanitizer report; the summary adds its error summary.
A process under the sanitizer needs far more GPU memory and time, so the defaults change:
2 processes (3 with caching on, or 8 with it off, ran a 139 GiB H200 out of memory on
tests/test_matmul.py, which fails tests and leaves launches unchecked: "Internal Sanitizer
Error ... didn't track the launch") and chunks of 200 tests (a chunk that dies loses only its
own tests, and results arrive as the run goes). Tests that still fail on out-of-memory are
run again at the end, one process alone on the GPU, and judged by that run.

--shard K/N keeps the K-th of N round-robin slices of the collected tests (1-based): a run
too long for one sitting (the suite under racecheck) split over N invocations.
"""

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SANITIZER_JOBS = 2  # the default under --tool (see above)
SANITIZER_CHUNK = 200  # tests per process under --tool
TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
PYTEST_SUMMARY = re.compile(r"\d+ (passed|failed|skipped|errors?|deselected)\b.* in [\d.]+s")
# How a sanitizer's reports begin (each is followed by its frames).
SANITIZER_REPORTS = (
    "========= Invalid",
    "========= Program hit",
    "========= Internal Sanitizer",
    "========= Error",
    "========= Warning",
    "========= Barrier error",
    "========= Race reported",
    "========= Uninitialized",
)
OOM = re.compile(r"out of memory|OutOfMemoryError|cudaErrorMemoryAllocation", re.IGNORECASE)


def parse_shard(text):
    m = re.fullmatch(r"(\d+)/(\d+)", text or "")
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise argparse.ArgumentTypeError(f"--shard wants K/N with 1 <= K <= N, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def start(cmd, ids, log_path, env):
    log = open(log_path, "w")
    return subprocess.Popen(cmd + ids, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log


def summarize(label, log_path, rc):
    """Prints a finished chunk's result; returns (failure lines, ids that failed on OOM)."""
    lines = log_path.read_text(errors="replace").splitlines()
    # pytest's last line ("3 failed, 58 passed in 9.1s"); none if the process died.
    summary = next(
        (line for line in reversed(lines) if PYTEST_SUMMARY.search(line)),
        f"no pytest summary: the process died (exit {rc}; see {log_path})",
    )
    errors = [
        line.strip("= ") for line in lines if "ERROR SUMMARY" in line or "RACECHECK SUMMARY" in line
    ][:1]
    print(f"  {label}: {summary.strip('= ')}" + "".join(f"; {e}" for e in errors), flush=True)
    failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    for line in failed:
        print(f"    {line}")
    reports = [line for line in lines if line.startswith(SANITIZER_REPORTS)]
    for line in reports[:5]:  # the rest are in the log
        print(f"    {line}")
    if len(reports) > 5:
        print(f"    ... {len(reports) - 5} more sanitizer lines in {log_path}")
    oom = [line.split()[1] for line in failed if OOM.search(line)]
    return failed, oom, reports


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="pytest processes at a time (default: one per two cores, at most 8; "
        f"under --tool, {SANITIZER_JOBS})",
    )
    ap.add_argument(
        "--paths",
        default="tests",
        help="comma-separated test files or folders to collect (default: tests)",
    )
    ap.add_argument(
        "--tool",
        choices=TOOLS,
        default=None,
        help="run each process under compute-sanitizer with this tool (see above)",
    )
    ap.add_argument(
        "--memcheck",
        action="store_const",
        const="memcheck",
        dest="tool",
        help="the same as --tool memcheck",
    )
    ap.add_argument(
        "--kernels",
        default=None,
        help="under --tool, check only kernels whose name contains this (passed "
        "as --kernel-name kns=...; e.g. 'fused' skips torch's and cuBLAS's)",
    )
    ap.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="tests per pytest process (default: all of them split over --jobs "
        f"processes; under --tool, {SANITIZER_CHUNK})",
    )
    ap.add_argument(
        "--shard",
        type=parse_shard,
        default=None,
        help="K/N: run only the K-th of N round-robin slices of the tests",
    )
    args, pytest_args = ap.parse_known_args()
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    # Collection prints one node id a line only at the default verbosity plus -q.
    verbosity = {"-q", "-qq", "-v", "-vv", "--quiet", "--verbose"}
    options = [a for a in pytest_args if a not in verbosity]
    collected = subprocess.run(
        base + ["-q", "--collect-only", *options, *args.paths.split(",")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    ids = [
        line for line in collected.stdout.splitlines() if line.startswith("tests/") and "::" in line
    ]
    if collected.returncode not in (0, 5) or not ids:
        print(collected.stdout[-3000:] + collected.stderr[-3000:])
        print(
            "run_parallel: no tests collected"
            if collected.returncode in (0, 5)
            else f"run_parallel: collection failed (exit {collected.returncode})"
        )
        return collected.returncode or 5
    if args.shard:
        k, n = args.shard
        ids = ids[k - 1 :: n]
    if args.jobs is None:
        args.jobs = SANITIZER_JOBS if args.tool else min(8, max(1, (os.cpu_count() or 2) // 2))
    jobs = max(1, min(args.jobs, len(ids)))
    chunk = args.chunk or (SANITIZER_CHUNK if args.tool else -(-len(ids) // jobs))
    n_chunks = -(-len(ids) // chunk)
    chunks = [ids[i::n_chunks] for i in range(n_chunks)]  # round-robin: even mixes of files
    logs = ROOT / "build" / "test_logs"
    logs.mkdir(parents=True, exist_ok=True)
    for old in logs.glob("chunk_*.log"):  # a wider earlier run's logs would read as this one's
        old.unlink()
    # COLUMNS: pytest cuts its short summary ("FAILED id - message") to the terminal width,
    # and the out-of-memory rerun reads the message.
    env = dict(
        os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // jobs)), COLUMNS="1000"
    )
    run = base
    if args.tool:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
        env["FUSED_OPS_MEMCHECK"] = "1"  # tests/utils.py: skips what cannot run there
        run = [
            "compute-sanitizer",
            "--tool",
            args.tool,
            "--error-exitcode",
            "1",
            "--print-limit",
            "100",
        ]
        if args.kernels:
            run += ["--kernel-name", f"kns={args.kernels}"]
        run += base
    run = run + ["-q", "-rfE", *pytest_args]
    shard = f" (shard {args.shard[0]}/{args.shard[1]})" if args.shard else ""
    print(
        f"run_parallel: {len(ids)} tests{shard} in {len(chunks)} chunk(s), {jobs} process(es) "
        f"at a time"
        + (f", under compute-sanitizer --tool {args.tool}" if args.tool else "")
        + f" (logs: {logs})",
        flush=True,
    )

    t0 = time.time()
    pending = list(enumerate(chunks))
    running = []
    failures, oom_ids, reports, status = [], [], 0, 0  # reports: sanitizer lines
    while pending or running:
        while pending and len(running) < jobs:
            j, chunk_ids = pending.pop(0)
            path = logs / f"chunk_{j}.log"
            running.append((j, path, *start(run, chunk_ids, path, env)))
        time.sleep(0.5)
        for item in [r for r in running if r[2].poll() is not None]:
            running.remove(item)
            j, path, proc, log = item
            log.close()
            failed, oom, found = summarize(
                f"chunk {j} ({len(chunks[j])} tests, {time.time() - t0:.0f} s)",
                path,
                proc.returncode,
            )
            failures += [f for f in failed if f.split()[1] not in oom]
            oom_ids += oom
            # A chunk whose only failures are out-of-memory ones (and the sanitizer's "didn't
            # track the launch" lines that come with them) is judged by the rerun below.
            real = [r for r in found if not (oom and r.startswith("========= Internal"))]
            reports += len(real)
            if proc.returncode != 0 and not (oom and len(oom) == len(failed) and not real):
                status = proc.returncode
    if oom_ids:
        print(
            f"run_parallel: {len(oom_ids)} tests failed on out-of-memory beside other "
            f"processes; running them again in one process",
            flush=True,
        )
        path = logs / "chunk_oom_rerun.log"
        proc, log = start(run, oom_ids, path, env)
        proc.wait()
        log.close()
        failed, oom, found = summarize("out-of-memory rerun", path, proc.returncode)
        failures += failed
        reports += len(found)
        status = status or proc.returncode
    print(
        f"run_parallel: {'all chunks passed' if status == 0 else 'FAILED'}"
        + (f", {len(failures)} failing tests" if failures else "")
        + (f", {reports} sanitizer report lines" if args.tool else "")
        + f" ({time.time() - t0:.0f} s)"
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
