"""Runs the selected tests in several pytest processes at once and reports them together.

    python tests/run_parallel.py [--jobs N] [--paths tests/test_a.py,...] [pytest options,
        e.g. -m cuda or -k softmax; no paths]

The GPU suite (`-m cuda`, ~2000 tests) takes over 7 minutes in one process on an H100 and
~2.5 in eight (session 18): most of a test's time is the host's (float64 references, torch
dispatch, compiling), which the processes share out while the GPU runs their kernels side
by side. The tests are collected once, dealt round-robin to the processes (a test's inputs
come from its own node id, tests/conftest.py, so the split changes nothing), and each
process gets OMP_NUM_THREADS = cores / jobs so their CPU work does not oversubscribe the
machine. Every process's log goes to build/test_logs/; the summary lists each one's result
and every failure. Exit status 0 only when every process passed.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=min(8, max(1, (os.cpu_count() or 2) // 2)),
                    help="pytest processes (default: one per two cores, at most 8)")
    ap.add_argument("--paths", default="tests",
                    help="comma-separated test files or folders to collect (default: tests)")
    args, pytest_args = ap.parse_known_args()
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    # Collection prints one node id a line only at the default verbosity plus -q.
    verbosity = {"-q", "-qq", "-v", "-vv", "--quiet", "--verbose"}
    options = [a for a in pytest_args if a not in verbosity]
    collected = subprocess.run(base + ["-q", "--collect-only", *options, *args.paths.split(",")],
                               cwd=ROOT, capture_output=True, text=True)
    ids = [line for line in collected.stdout.splitlines()
           if line.startswith("tests/") and "::" in line]
    if collected.returncode not in (0, 5) or not ids:
        print(collected.stdout[-3000:] + collected.stderr[-3000:])
        print("run_parallel: no tests collected" if collected.returncode in (0, 5)
              else f"run_parallel: collection failed (exit {collected.returncode})")
        return collected.returncode or 5
    jobs = max(1, min(args.jobs, len(ids)))
    logs = ROOT / "build" / "test_logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // jobs)))
    print(f"run_parallel: {len(ids)} tests in {jobs} processes (logs: {logs})", flush=True)
    procs = []
    for j in range(jobs):
        log = open(logs / f"chunk_{j}.log", "w")
        procs.append((subprocess.Popen(base + ["-q", "-rfE", *pytest_args, *ids[j::jobs]],
                                       cwd=ROOT, env=env, stdout=log,
                                       stderr=subprocess.STDOUT), log))
    status = 0
    for j, (proc, log) in enumerate(procs):
        rc = proc.wait()
        log.close()
        lines = (logs / f"chunk_{j}.log").read_text().splitlines()
        summary = next((line for line in reversed(lines) if line.strip()), "(no output)")
        print(f"  process {j}: {summary.strip('= ')}")
        for line in lines:
            if line.startswith(("FAILED ", "ERROR ")):
                print(f"    {line}")
        status = status or rc
    return status


if __name__ == "__main__":
    sys.exit(main())
