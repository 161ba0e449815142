"""Runs the selected tests in several pytest processes at once and reports them together.

    python tests/run_parallel.py [--jobs N] [--paths tests/test_a.py,...] [--memcheck]
        [pytest options, e.g. -m cuda or -k softmax; no paths]

The GPU suite (`-m cuda`, ~2000 tests) takes over 7 minutes in one process on an H100 and
~2.5 in eight: most of a test's time is the host's (float64 references, torch
dispatch, compiling), which the processes share out while the GPU runs their kernels side
by side. The tests are collected once, dealt round-robin to the processes (a test's inputs
come from its own node id, tests/conftest.py, so the split changes nothing), and each
process gets OMP_NUM_THREADS = cores / jobs so their CPU work does not oversubscribe the
machine. Every process's log goes to build/test_logs/; the summary lists each one's result
and every failure. Exit status 0 only when every process passed.

--memcheck runs each process under `compute-sanitizer --tool memcheck` with torch's caching
allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): each tensor is then its own allocation, so
a read past its end is reported rather than landing in a cached neighbour's bytes. CUDA
graph capture and the CUDA profiler do not run there, so the tests that need them skip
(tests/utils.py, skip_under_memcheck); the plain run checks them. A process fails on any
sanitizer error; the summary adds each one's error count. It takes fewer processes than
the plain run (default 2): a process under the sanitizer needs far more GPU memory, and 3
(caching on) or 8 (caching off) of them on tests/test_matmul.py ran a 139 GiB H200 out of
memory, which fails tests and leaves launches unchecked ("Internal Sanitizer Error ...
didn't track the launch").
"""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEMCHECK_JOBS = 2  # the default under --memcheck (see above)
PYTEST_SUMMARY = re.compile(r"\d+ (passed|failed|skipped|errors?|deselected)\b.* in [\d.]+s")
# How memcheck's reports begin (each is followed by its frames).
SANITIZER_REPORTS = ("========= Invalid", "========= Program hit", "========= Internal Sanitizer")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=None,
                    help="pytest processes (default: one per two cores, at most 8; with "
                         "--memcheck, 2)")
    ap.add_argument("--paths", default="tests",
                    help="comma-separated test files or folders to collect (default: tests)")
    ap.add_argument("--memcheck", action="store_true",
                    help="run each process under compute-sanitizer memcheck (see above)")
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
    if args.jobs is None:
        args.jobs = MEMCHECK_JOBS if args.memcheck else min(8, max(1, (os.cpu_count() or 2) // 2))
    jobs = max(1, min(args.jobs, len(ids)))
    logs = ROOT / "build" / "test_logs"
    logs.mkdir(parents=True, exist_ok=True)
    for old in logs.glob("chunk_*.log"):  # a wider earlier run's logs would read as this one's
        old.unlink()
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // jobs)))
    run = base
    if args.memcheck:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
        env["FUSED_OPS_MEMCHECK"] = "1"  # tests/utils.py: skips what cannot run there
        run = ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1",
               "--print-limit", "100"] + base
    print(f"run_parallel: {len(ids)} tests in {jobs} processes (logs: {logs})", flush=True)
    procs = []
    for j in range(jobs):
        log = open(logs / f"chunk_{j}.log", "w")
        procs.append((subprocess.Popen(run + ["-q", "-rfE", *pytest_args, *ids[j::jobs]],
                                       cwd=ROOT, env=env, stdout=log,
                                       stderr=subprocess.STDOUT), log))
    status = 0
    for j, (proc, log) in enumerate(procs):
        rc = proc.wait()
        log.close()
        lines = (logs / f"chunk_{j}.log").read_text().splitlines()
        # pytest's last line ("3 failed, 58 passed in 9.1s"); none if the process died.
        summary = next((line for line in reversed(lines) if PYTEST_SUMMARY.search(line)),
                       "no pytest summary: the process died (see its log)")
        errors = [line.strip("= ") for line in lines if "ERROR SUMMARY" in line][:1]
        print(f"  process {j}: {summary.strip('= ')}" + "".join(f"; {e}" for e in errors))
        for line in lines:
            if line.startswith(("FAILED ", "ERROR ")):
                print(f"    {line}")
        reports = [line for line in lines if line.startswith(SANITIZER_REPORTS)]
        for line in reports[:5]:  # the rest are in the log
            print(f"    {line}")
        status = status or rc
    return status


if __name__ == "__main__":
    sys.exit(main())
