"""Run the benchmark suite: every case in benchmarks/cases, every implementation.

    python benchmarks/run.py                          # everything (long: minutes per op)
    python benchmarks/run.py --quick                  # each case's quick shapes, bf16
    python benchmarks/run.py --ops gelu --dtypes bf16 --shapes 16384x4096 --passes fwd
    python benchmarks/run.py --save-results           # also benchmarks/results/<gpu>.json
    python benchmarks/run.py --ops matmul --rounds 5  # implementations timed interleaved
    python benchmarks/run.py --report FILE.json       # re-render a saved run (no GPU needed)
    python benchmarks/run.py --sweep quick --ops softmax,log_softmax
                                                      # % of copy against row length
                                                      # (benchmarks/sweep.py; --sweep full)
    python benchmarks/run.py --ops layer_norm --shapes 1x4096,16x4096,128x4096 --dtypes bf16
                                                      # the decode rows: wall-clock vs GPU time

Every record has two times: median_us, the GPU time (host overhead hidden), and wall_us,
the wall-clock time per call of back-to-back calls (what a user waits for; see
benchmarks/harness.py). --no-wall skips the second.

Writes to --out (default bench_out/): results.json, results.md and one PNG per
op/variant/pass/dtype; prints the table on stdout and a progress bar on stderr.
"""

import argparse
import datetime
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import harness, report, sweep  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ops", help="comma-separated op names (or case file names), e.g. gelu")
    p.add_argument("--dtypes", help="comma-separated: bf16,fp16,fp32")
    p.add_argument(
        "--shapes",
        help="comma-separated shapes replacing the cases' own, "
        "e.g. 16384x4096,4096x32768 (applied to cases of the "
        "same rank)",
    )
    p.add_argument(
        "--passes",
        help="comma-separated: fwd,fwd+bwd,bwd (bwd: the backward "
        "alone; the norm and softmax cases time it)",
    )
    p.add_argument("--impls", help="comma-separated: fused,native,unfused,compile,...")
    p.add_argument(
        "--quick",
        action="store_true",
        help="each case's quick_shapes, bf16 only, fewer repetitions",
    )
    p.add_argument("--out", default="bench_out", help="output folder (default bench_out/)")
    p.add_argument(
        "--save-results", action="store_true", help="also write benchmarks/results/<gpu-name>.json"
    )
    p.add_argument(
        "--results-name",
        help="file name (without .json) for --save-results; default: the sanitized GPU name",
    )
    p.add_argument(
        "--budget-ms",
        type=float,
        default=None,
        help="time spent on each measurement's repetitions (default 100, --quick 25)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="time the implementations of each row interleaved, in N rounds of "
        "1/N of their repetitions in a rotating order, so GPU clock drift "
        "does not favour the one timed first (default 1: one after another)",
    )
    p.add_argument(
        "--no-wall",
        action="store_true",
        help="skip the wall-clock figure (wall_us: back-to-back calls, no spin "
        "kernel hiding the host, no L2 flush)",
    )
    p.add_argument(
        "--sweep",
        choices=["quick", "full"],
        help="the shapes sweep (benchmarks/sweep.py): row lengths odd and aligned, "
        "~2^25 elements a shape, passes fwd,fwd+bwd unless --passes, 10 ms a measurement "
        "unless --budget-ms, plus one sweep_<op>.png per op. quick: 5 widths, bf16, the "
        "softmax and norm ops, fused/native/compile; full: 13 widths, 3 dtypes, every row "
        "op, fused/native (--ops, --dtypes, --impls override)",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--report",
        metavar="JSON",
        help="render the table and plots of a saved results JSON and exit",
    )
    return p.parse_args(argv)


def split(text):
    return [s.strip() for s in text.split(",") if s.strip()] if text else None


def emit(header, records, out_dir, plots=True):
    """Print the table, write results.md and the plots under out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    print(report.header_text(header))
    print()
    print(report.pivot_table(records))
    err = report.errors_text(records)
    if err:
        print()
        print(err)
    md_path = os.path.join(out_dir, "results.md")
    with open(md_path, "w") as f:
        f.write(report.markdown_report(header, records))
    written = [md_path]
    if plots:
        pngs = report.write_plots(header, records, out_dir)
        if not pngs and records:
            print("note: matplotlib not installed, no plots written", file=sys.stderr)
        written += pngs
    return written


def load_results(path):
    try:
        return report.load_json(path)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: cannot read {path}: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv=None):
    args = parse_args(argv)
    try:
        shapes = harness.parse_shapes(args.shapes) if args.shapes else None
        dtypes = harness.parse_dtypes(args.dtypes) if args.dtypes else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print(f"error: --rounds must be at least 1, not {args.rounds}", file=sys.stderr)
        return 2
    if args.sweep:
        if args.shapes:
            print("error: --sweep chooses the shapes: drop --shapes", file=sys.stderr)
            return 2
        quick = args.sweep == "quick"
        shapes = sweep.shapes(quick=quick)
        if dtypes is None and quick:
            dtypes = harness.parse_dtypes("bf16")
        args.ops = args.ops or ",".join(sweep.QUICK_OPS if quick else sweep.FULL_OPS)
        args.impls = args.impls or ",".join(sweep.QUICK_IMPLS if quick else sweep.FULL_IMPLS)
        args.passes = args.passes or "fwd,fwd+bwd"
        args.budget_ms = args.budget_ms or 10.0
    passes = split(args.passes)
    if passes and set(passes) - set(harness.PASSES):
        print(
            f"error: unknown pass in {args.passes!r}: use {', '.join(harness.PASSES)}",
            file=sys.stderr,
        )
        return 2

    if args.report:
        header, records = load_results(args.report)
        emit(header, records, args.out, plots=not args.no_plots)
        return 0

    harness.require_cuda("the benchmark")
    harness.import_fused_ops()
    import torch

    cases = harness.discover_cases()
    plans = harness.select(
        cases,
        ops=split(args.ops),
        shapes=shapes,
        dtypes=dtypes,
        passes=passes,
        impls=split(args.impls),
        quick=args.quick,
    )
    if not plans:
        known = sorted({c.op for c in cases})
        print(
            f"error: nothing to measure for these options (ops with cases: "
            f"{', '.join(known) or 'none'})",
            file=sys.stderr,
        )
        return 2

    harness.configure_compile()
    budget = args.budget_ms or (25.0 if args.quick else 100.0)
    timer = harness.Timer(budget_ms=budget)
    env = harness.environment()
    print(f"measuring ceilings on {env['device']} ...", file=sys.stderr)
    ceilings = harness.measure_ceilings(timer)
    header = {
        **env,
        "ceilings": ceilings,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "budget_ms": budget,
        "rounds": args.rounds,
        "l2_flush_bytes": timer.flush_bytes,
        "wall_clock": not args.no_wall,
    }

    progress = harness.Progress(harness.total_measurements(plans))
    records = []

    def on_impl(plan, impl):
        progress.step(
            f"{plan.case.label} {plan.pass_} {harness.shape_str(plan.shape)} "
            f"{harness.dtype_name(plan.dtype)} {impl}"
        )

    try:
        for plan in plans:
            records += harness.run_plan(
                plan,
                timer,
                ceilings,
                env,
                on_impl=on_impl,
                rounds=args.rounds,
                wall=not args.no_wall,
            )
            torch.cuda.empty_cache()
    except KeyboardInterrupt:
        print("\ninterrupted: reporting what was measured", file=sys.stderr)
    progress.close()
    records += harness.summed_records(records)

    json_path = os.path.join(args.out, "results.json")
    report.write_json(json_path, header, records)
    written = [json_path] + emit(
        header, records, args.out, plots=not args.no_plots and not args.sweep
    )
    if args.sweep and not args.no_plots:
        written += sweep.write_plots(header, records, args.out)
    if args.save_results:
        name = args.results_name or harness.sanitize_name(env["device"])
        path = os.path.join(ROOT, "benchmarks", "results", f"{name}.json")
        report.write_json(path, header, records)
        written.append(path)
    print(
        f"\nwrote {', '.join(written[:3])}"
        + (f" and {len(written) - 3} more" if len(written) > 3 else ""),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
