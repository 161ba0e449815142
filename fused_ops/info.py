"""`python -m fused_ops.info`: how this fused_ops was built and what it runs here.

Prints the fused_ops version and location; the torch, CUDA toolkit and C++ compiler it was
built with (recorded by setup.py in fused_ops/_build_info.py) beside the torch running now;
the GPU architectures compiled in; the current GPU and which kernels it gets (the Hopper
paths or the portable ones); the overrides in force (fused_ops.overrides: FUSED_OPS_OVERRIDES
or the last spec set), one key a line; and any other FUSED_* environment variable that is set,
marked where the kernels no longer read it.
"""

import os
import platform
import re
import sys

import torch

import fused_ops
from fused_ops import _build_info
from fused_ops import overrides as _overrides


def parse_arch_list(arch_list):
    """TORCH_CUDA_ARCH_LIST ("8.0+PTX;9.0a") as [(major, minor, arch_specific, ptx)]; entries
    that are not numbers are left out."""
    archs = []
    for entry in re.split(r"[;\s]+", arch_list or ""):
        m = re.fullmatch(r"(\d+)\.(\d+)([af]?)(\+PTX)?", entry.strip())
        if m:
            archs.append((int(m.group(1)), int(m.group(2)), m.group(3), bool(m.group(4))))
    return archs


def arch_names(archs):
    names = []
    for major, minor, suffix, ptx in archs:
        names.append(
            f"sm_{major}{minor}{suffix}" + (f" + PTX compute_{major}{minor}" if ptx else "")
        )
    return names


def code_for(capability, archs):
    """Which compiled code a GPU of `capability` (major, minor) runs, as (kind, (major,
    minor)): ("sass", arch) for machine code built for it, ("ptx", arch) for PTX the driver
    compiles at load, or None where nothing in the build runs on it. sm_XYa code runs only on
    exactly X.Y; sm_XY code on X.Y and later minors of X; PTX on anything at least as new."""
    major, minor = capability
    sass = [
        (a, b)
        for a, b, suffix, _ in archs
        if (a, b) == (major, minor) or (not suffix and a == major and b <= minor)
    ]
    if sass:
        return "sass", max(sass)
    ptx = [(a, b) for a, b, _, has_ptx in archs if has_ptx and (a, b) <= (major, minor)]
    if ptx:
        return "ptx", max(ptx)
    return None


def parse_spec(spec):
    """An overrides spec ("matmul.kernel=portable,pdl=0") as {key: value}, a key given twice
    taking its last value as in the extension's parser. Keys and values are not checked here:
    the extension does that (spec_in_force reports its error)."""
    out = {}
    for item in (spec or "").split(","):
        key, eq, value = item.partition("=")
        if eq and key.strip():
            out[key.strip()] = value.strip()
    return out


def spec_in_force(env=os.environ):
    """(spec, error): the overrides spec in force, as the extension holds it (FUSED_OPS_OVERRIDES
    read at the first use, or the last spec set through fused_ops.overrides), and None; or,
    where the extension rejects FUSED_OPS_OVERRIDES, the variable as set and the error."""
    try:
        return _overrides.current(), None
    except RuntimeError as e:
        return env.get("FUSED_OPS_OVERRIDES", ""), str(e).strip().splitlines()[0]


def kernels_for(capability, archs, spec=""):
    """What the ops run on a GPU of `capability` with this build under the overrides `spec`:
    lines of text."""
    code = code_for(capability, archs)
    if code is None:
        return [
            f"no kernels for this GPU: the build has {', '.join(arch_names(archs)) or 'none'} "
            f"(rebuild with TORCH_CUDA_ARCH_LIST including {capability[0]}.{capability[1]})"
        ]
    kind, (a, b) = code
    lines = [
        f"runs {'sm_%d%d machine code' % (a, b) if kind == 'sass' else 'PTX compute_%d%d, compiled by the driver at load' % (a, b)}"
    ]
    hopper_sass = kind == "sass" and a >= 9
    hopper_gemm = capability == (9, 0) and any((x, y, s) == (9, 0, "a") for x, y, s, _ in archs)
    keys = parse_spec(spec)
    choice = keys.get("matmul.kernel", "auto")
    if hopper_gemm and choice != "portable":
        lines.append(
            "matmul / linear (bf16, fp16): Hopper kernel (wgmma + TMA, sm_90a) where "
            "the operands suit TMA, else the portable mma.sync kernel"
        )
    else:
        why = (
            "override matmul.kernel=portable"
            if hopper_gemm
            else "needs a compute capability 9.0 GPU"
            if capability != (9, 0)
            else "the build has no sm_90a code"
        )
        if choice == "hopper":
            lines.append(
                "matmul / linear (bf16, fp16): none, the calls fail: the override "
                f"matmul.kernel=hopper asks for the Hopper kernel ({why})"
            )
        else:
            lines.append(
                f"matmul / linear (bf16, fp16): portable mma.sync kernel (Hopper kernel: {why})"
            )
    if hopper_sass:
        clusters = "thread-block clusters for long rows" + (
            " (softmax's off: override softmax.cluster=0)"
            if keys.get("softmax.cluster") == "0"
            else ""
        )
        pdl = (
            "programmatic dependent launch"
            if keys.get("pdl") != "0"
            else "no programmatic dependent launch: override pdl=0"
        )
        lines.append(f"softmax, norms, dropout: sm_90 paths ({clusters}, {pdl})")
    else:
        lines.append(
            "softmax, norms, dropout: portable paths (no clusters / early launch: "
            + ("not sm_90 code" if capability[0] >= 9 else "needs sm_90")
            + ")"
        )
    return lines


# FUSED_* variables that are read by the build (setup.py) or the test runner, not the kernels.
NOT_OVERRIDES = {"FUSED_OPS_CUDA", "FUSED_OPS_BUILD_CHECKS", "FUSED_OPS_MEMCHECK"}

# The variables FUSED_OPS_OVERRIDES replaced: set, they change nothing.
RETIRED_PREFIXES = ("FUSED_NORM_", "FUSED_SOFTMAX_", "FUSED_OPS_MATMUL_", "FUSED_PDL")


def other_fused_vars(env=os.environ):
    """Every FUSED_* variable that is set other than FUSED_OPS_OVERRIDES and the build's, as
    sorted (name, value, retired) triples; retired: a variable the kernels no longer read."""
    return sorted(
        (k, v, k.startswith(RETIRED_PREFIXES))
        for k, v in env.items()
        if k.startswith("FUSED_") and k not in NOT_OVERRIDES and k != "FUSED_OPS_OVERRIDES"
    )


def report():
    """The whole report, as lines of text."""
    b = _build_info
    get = lambda name: getattr(b, name, None)  # noqa: E731  (builds before a field existed)
    # __path__, not __file__: run from an unbuilt source tree, the submodules come from the
    # installed copy (fused_ops/__init__.py).
    out = [f"fused_ops {fused_ops.__version__}  ({fused_ops.__path__[0]})", ""]
    out.append("Built with:")
    out.append(
        f"  torch          {b.TORCH_VERSION}"
        + (f" (CUDA {get('TORCH_CUDA_VERSION')})" if get("TORCH_CUDA_VERSION") else "")
    )
    out.append(f"  C++ compiler   {get('CXX') or 'not recorded'}")
    if b.WITH_CUDA:
        out.append(f"  CUDA toolkit   {get('NVCC') or 'not recorded'}")
        if get("CUDA_HOST_CC"):
            out.append(f"  nvcc host      {get('CUDA_HOST_CC')}")
    archs = parse_arch_list(get("CUDA_ARCH_LIST"))
    out.append(
        "  CUDA kernels   "
        + (
            ", ".join(arch_names(archs)) or str(get("CUDA_ARCH_LIST"))
            if b.WITH_CUDA
            else "not built (CPU kernels only)"
        )
    )
    out.append("")
    out.append("Running with:")
    out.append(f"  python         {platform.python_version()} ({sys.executable})")
    out.append(
        f"  torch          {torch.__version__}"
        + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else "")
        + ("" if torch.__version__ == b.TORCH_VERSION else "  <- differs from the build")
    )
    spec, error = spec_in_force()
    if not torch.cuda.is_available():
        out.append("  GPU            none visible to torch: the ops run their CPU kernels")
    else:
        i = torch.cuda.current_device()
        p = torch.cuda.get_device_properties(i)
        cap = (p.major, p.minor)
        out.append(
            f"  GPU {i}          {p.name}, compute capability {p.major}.{p.minor}, "
            f"{p.multi_processor_count} SMs"
        )
        if b.WITH_CUDA:
            out += [f"    {line}" for line in kernels_for(cap, archs, "" if error else spec)]
        else:
            out.append("    the build has no CUDA kernels: CUDA tensors are not supported")
    out.append("")
    if error:
        out.append(
            f"Overrides: FUSED_OPS_OVERRIDES='{spec}' is rejected (the first op call "
            f"raises): {error}"
        )
    elif not parse_spec(spec):
        out.append(
            "Overrides: none (every default; FUSED_OPS_OVERRIDES or fused_ops.overrides sets them)"
        )
    else:
        out.append(f"Overrides: {spec}")
        out += [f"  {k}={v}" for k, v in parse_spec(spec).items()]
    others = other_fused_vars()
    if others:
        out.append("Other FUSED_* variables set:")
        out += [
            f"  {k}={v}"
            + ("  (not read any more: FUSED_OPS_OVERRIDES replaced it)" if retired else "")
            for k, v, retired in others
        ]
    return out


def main():
    print("\n".join(report()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
