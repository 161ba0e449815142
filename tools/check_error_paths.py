"""Every op's error path, in the extension as built: a bad input must raise a Python
exception, never crash the process.

    python tools/check_error_paths.py [--build] [--devices cpu,cuda]

An extension linked with another C++ runtime than the one torch loads (setup.py,
check_compiler) works until an op raises its first c10::Error, and then crashes in
std::ostream or the unwinder. So this script calls every op registered under torch.ops.fused
with inputs each op must refuse (wrong dtype, mismatched shapes, out-of-range arguments,
mixed devices), each device in its own child process, and then runs the test suite's
error-path tests the same way: a child killed by a signal is reported as a crash.

--build first rebuilds the extension in place the way a user on this machine would: no CC,
CXX or CUDAHOSTCXX in the environment, setup.py's own compiler choice (it prints the compiler
it switched to, if any). --build --unchecked builds with the machine's default compiler even
where setup.py would replace it: the crash its check prevents. Exit status 0 only when nothing crashed and every op raised on at
least one bad input.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The error-path tests of the suite (tests/test_<op>.py).
ERROR_TESTS = "bad_inputs or errors or bad_kernel_env or bad_tile_group_env"


def bad_calls(schema, device, torch):
    """(label, args, kwargs) calls of an op that its checks must refuse, from its schema."""
    import itertools

    def value(arg, case, tensors):
        t = str(arg.type)
        name = arg.name
        if t in ("Tensor", "Optional[Tensor]"):
            return next(tensors)
        if t == "List[int]":  # normalized_shape
            return [7] if case == "shape" else [8]
        if t in ("float", "Optional[float]"):
            if case == "value" and name == "p":
                return 1.5
            return 0.5 if name == "p" else (arg.default_value if arg.has_default_value() else 1.0)
        if t == "int":  # dim
            return 5 if case == "value" else -1
        if t == "bool":
            return True
        if t.startswith("List[bool]"):
            return [True, True]
        if t in ("str", "Optional[str]"):
            if case == "value":
                return "bogus"
            if arg.has_default_value() and arg.default_value is not None:
                return arg.default_value
            return "none" if name == "approximate" else ("gelu" if t == "str" else None)
        if arg.has_default_value():
            return arg.default_value
        return None

    def make(case):
        def gen():
            first = True
            while True:
                if case == "dtype":
                    yield torch.ones(4, 8, dtype=torch.int32, device=device)
                elif case == "shape":
                    yield torch.randn((4, 8) if first else (3, 5), device=device)
                elif case == "device":
                    yield torch.randn(4, 8, device=device if first else "cpu")
                else:
                    yield torch.randn(4, 8, device=device)
                first = False

        tensors = gen()
        args, kwargs = [], {}
        for arg in schema.arguments:
            v = value(arg, case, tensors)
            if arg.kwarg_only:
                kwargs[arg.name] = v
            else:
                args.append(v)
        return case, args, kwargs

    cases = ["dtype", "shape", "value"] + (["device"] if device != "cpu" else [])
    return [make(c) for c in itertools.chain(cases)]


def child(device):
    """Calls every fused op with bad inputs on `device`; prints one line per call."""
    sys.path.insert(0, ROOT)  # the extension as built in this checkout
    import torch

    import fused_ops  # noqa: F401  (registers the ops)

    names = sorted(
        n.split("::", 1)[1]
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("fused::")
    )
    print(f"{len(names)} ops registered under torch.ops.fused", flush=True)
    silent = []
    for name in names:
        packet = getattr(torch.ops.fused, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            raised = 0
            for label, args, kwargs in bad_calls(op._schema, device, torch):
                print(f"  {name}.{overload} [{label}] ...", end=" ", flush=True)
                try:
                    op(*args, **kwargs)
                    if device != "cpu":
                        torch.cuda.synchronize()
                    print("accepted", flush=True)
                except Exception as e:  # what the check wants: any exception, no crash
                    raised += 1
                    msg = str(e).strip().splitlines()[0][:110] if str(e).strip() else ""
                    print(f"{type(e).__name__}: {msg}", flush=True)
            # An op without arguments (the `_overrides` getter) has no bad input to refuse.
            if raised == 0 and op._schema.arguments:
                silent.append(f"{name}.{overload}")
    if silent:
        print(f"ops that raised on none of their bad inputs: {', '.join(silent)}")
        return 1
    return 0


def run(cmd, what):
    """Runs a child; returns a failure line or None. Its output streams through."""
    print(f"\n== {what}: {' '.join(cmd)}", flush=True)
    r = subprocess.run(cmd, cwd=ROOT)
    if r.returncode < 0:
        sig = signal.Signals(-r.returncode).name
        return f"{what}: CRASHED ({sig}), the last line above is the call that crashed it"
    if r.returncode != 0:
        return f"{what}: failed (exit {r.returncode})"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--build",
        action="store_true",
        help="rebuild in place with this machine's default compiler settings first",
    )
    ap.add_argument(
        "--unchecked",
        action="store_true",
        help="with --build: FUSED_OPS_BUILD_CHECKS=0, so the default compiler is used "
        "even where setup.py would replace it (to see what its check prevents)",
    )
    ap.add_argument(
        "--devices", default=None, help="comma-separated (default: cpu, and cuda where a GPU is)"
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child)

    if args.build:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("CC", "CXX", "CUDAHOSTCXX", "FUSED_OPS_BUILD_CHECKS")
        }
        env.setdefault("MAX_JOBS", str(os.cpu_count() or 2))
        if args.unchecked:
            env["FUSED_OPS_BUILD_CHECKS"] = "0"
        cmd = [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
        print(f"== build with the default compiler settings: {' '.join(cmd)}", flush=True)
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        for line in (r.stdout + r.stderr).splitlines():
            if line.startswith("fused_ops") or "error" in line.lower():
                print("  " + line)
        if r.returncode != 0:
            print((r.stdout + r.stderr)[-4000:])
            print("check_error_paths: FAIL (the build failed)")
            return 1

    py = [sys.executable, "-X", "faulthandler"]
    info = subprocess.run(
        py
        + [
            "-c",
            "from fused_ops import _build_info as b; "
            "print(b.CXX, '| nvcc host:', getattr(b, 'CUDA_HOST_CC', None))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    print(f"extension built with: {info.stdout.strip() or info.stderr.strip()[-300:]}")
    default = shutil.which("c++")
    version = (
        default and subprocess.run([default, "--version"], capture_output=True, text=True).stdout
    )
    print(
        f"this machine's default c++: {default} ({version.splitlines()[0] if version else '?'})"
        if default
        else "this machine has no c++ on PATH"
    )

    if args.devices:
        devices = args.devices.split(",")
    else:
        has_gpu = (
            subprocess.run(
                py + ["-c", "import torch; print(torch.cuda.is_available())"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            == "True"
        )
        devices = ["cpu"] + (["cuda"] if has_gpu else [])
    failures = []
    for device in devices:
        failures.append(
            run(
                py + [os.path.abspath(__file__), "--child", device],
                f"bad inputs to every op on {device}",
            )
        )
    failures.append(
        run(
            py + ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", "-k", ERROR_TESTS],
            "the suite's error-path tests",
        )
    )
    failures = [f for f in failures if f]
    print()
    for f in failures:
        print(f"check_error_paths: {f}")
    print(
        "check_error_paths: "
        + ("FAIL" if failures else "PASS (every op raised a Python exception, nothing crashed)")
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
