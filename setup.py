"""Build fused_ops: one extension, fused_ops._C, holding every op's CPU and CUDA kernels.

CUDA kernels are compiled when a CUDA toolkit is found (FUSED_OPS_CUDA=0/1 overrides).
Build with `pip install --no-build-isolation .`: the extension must be compiled against the
torch that is already installed, and build isolation would hide it.

Before anything is compiled, three checks stop the build with one message that says what to
run (FUSED_OPS_BUILD_CHECKS=0 skips them):
  - torch: importable here, and the version this source supports (SUPPORTED_TORCH);
  - setuptools: able to write a wheel (70.1 or later, or the `wheel` package);
  - the C++ compiler: links the C++ runtime that torch runs with (check_compiler).
"""

import glob
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION = "0.1.0"
# The torch release this source builds against and is tested with: another minor version
# has other C++ headers (2.15's need C++20) and fails deep inside the compile.
SUPPORTED_TORCH = "2.11"
# Small default arch list keeps CI builds short: sm_80 (portable kernels, plus PTX for newer
# GPUs) and sm_90a (Hopper-only wgmma/TMA). TORCH_CUDA_ARCH_LIST overrides it.
DEFAULT_ARCHS = "8.0+PTX;9.0a"
INSTALL = "pip install --no-build-isolation ."
# The optional extra `pip install fused_ops[hf]`: the transformers the fused_ops.hf patchers
# are written against (its GPT-2 and Llama forwards' keyword arguments, masking_utils).
HF_REQUIREMENT = "transformers>=5.24,<6"
CHECKS = os.environ.get("FUSED_OPS_BUILD_CHECKS", "1") != "0"


def stop(message):
    """End the build with one message (pip shows a backend's stderr as the error's output)."""
    sys.stderr.write(f"\nfused_ops: {message}\n\n")
    sys.exit(1)


def outside_build_env():
    """What this interpreter sees outside any build isolation: {"torch": version or None,
    "torch_dir", "wheels": whether its setuptools can write a wheel}, or None if that cannot
    be read. pip's isolated builds hide the environment's site-packages through PYTHONPATH
    and PYTHONNOUSERSITE, which -E ignores. The torch version is torch.__version__ as
    torch/version.py states it (the package metadata may lack its local part, e.g. +cu130),
    read without importing torch."""
    code = """if True:
        import importlib.metadata as m, importlib.util as u, json, os, re
        s = u.find_spec("torch")
        d = s.submodule_search_locations[0] if s else None
        v = d and re.search(r"__version__ = '([^']+)'", open(os.path.join(d, "version.py")).read())
        try:
            st = [int(p) for p in re.findall(r"\\d+", m.version("setuptools"))[:2]]
        except m.PackageNotFoundError:
            st = []
        print(json.dumps({"torch": v.group(1) if v else None, "torch_dir": d,
                          "wheels": st >= [70, 1] or u.find_spec("wheel") is not None}))"""
    try:
        out = subprocess.run(
            [sys.executable, "-E", "-c", code], capture_output=True, text=True, timeout=60
        ).stdout
        return json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def tools_first():
    """The command that makes this environment able to write a wheel, with '&& ' after it."""
    return f'pip install "setuptools>=70.1" torch=={SUPPORTED_TORCH}.0 && '


def import_torch():
    """The torch to build against, or stop with what was found and the command to run."""
    try:
        with warnings.catch_warnings():  # torch's import-time notes (no numpy) are not ours
            warnings.simplefilter("ignore")
            import torch
    except ImportError:
        torch = None
    if not CHECKS and torch is not None:
        return torch
    want = f"torch {SUPPORTED_TORCH}.*"
    outside = outside_build_env() or {}
    prefix = "" if outside.get("wheels", True) else tools_first()
    if torch is None:
        if not outside.get("torch"):
            stop(
                f"no torch in {sys.executable}; fused_ops builds against {want}. Install it "
                f"first: {tools_first()}{INSTALL}"
            )
        stop(
            f"this build cannot see torch {outside['torch']} ({outside['torch_dir']}): pip "
            f"builds in an isolated environment unless told not to, and the extension must be "
            f"compiled against the torch it will run with (fused_ops builds against {want}). "
            f"Run: {prefix}{INSTALL}"
        )
    found = f"torch {torch.__version__} ({os.path.dirname(torch.__file__)})"
    if not torch.__version__.startswith(SUPPORTED_TORCH + "."):
        stop(
            f"found {found}, but fused_ops builds against {want} only. Run: "
            f"{tools_first()}{INSTALL}"
        )
    if outside.get("torch") and outside["torch"] != torch.__version__:
        stop(
            f"the build environment has {found}, but this Python runs torch "
            f"{outside['torch']} ({outside['torch_dir']}); the extension must be compiled "
            f"against the torch it will run with. Run: {prefix}{INSTALL}   (a torch put first on "
            f"PYTHONPATH on purpose: FUSED_OPS_BUILD_CHECKS=0)"
        )
    return torch


def check_wheel_support():
    """A wheel (pip install, pip wheel, python -m build) needs setuptools 70.1 or later, or
    the `wheel` package: older setuptools fails with "invalid command 'bdist_wheel'"."""
    import setuptools

    version = tuple(int(p) for p in re.findall(r"\d+", setuptools.__version__)[:2])
    if version >= (70, 1):
        return
    try:
        import wheel  # noqa: F401
    except ImportError:
        stop(
            f"setuptools {setuptools.__version__} cannot build a wheel without the `wheel` "
            f"package (setuptools 70.1 can). Run: {tools_first()}{INSTALL}   (torch in the "
            f"same command keeps setuptools within the versions torch accepts)"
        )


# ---------------------------------------------------------------------------------------
# The compiler. The extension runs in a process whose C++ runtime (libstdc++) torch already
# loaded. An extension linked with another runtime (a compiler wrapper that links libstdc++
# statically, or a newer GCC whose libstdc++ has symbols the loaded one lacks) then mixes two
# runtimes: the first c10::Error an op raises crashes inside std::ostream or the unwinder,
# or the import fails on a missing GLIBCXX symbol. A small probe library, compiled and
# linked the way the extension will be, shows which runtime a compiler links.

PROBE = r"""
#include <sstream>
#include <stdexcept>
#include <string>
extern "C" int fused_ops_probe(int x) {
  std::ostringstream s;
  s << "value " << x;
  if (x < 0) throw std::runtime_error(s.str());
  return static_cast<int>(s.str().size());
}
"""


GLIBCXX = re.compile(r"GLIBCXX_(3\.4(?:\.\d+)?)(?![.\d])")


def glibcxx_max(text):
    """The newest GLIBCXX_3.4[.N] version named in text, as a tuple (None if none is)."""
    found = [tuple(int(p) for p in v.split(".")) for v in GLIBCXX.findall(text)]
    return max(found) if found else None


def glibcxx_provided(path):
    """The newest GLIBCXX version a libstdc++ file defines (its version names are plain
    strings in the file)."""
    with open(path, "rb") as f:
        return glibcxx_max(f.read().decode("latin-1"))


def loaded_libstdcxx():
    """The libstdc++ this process (torch) has loaded, or None (not Linux, or none)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "/libstdc++.so" in path:
                    return os.path.realpath(path)
    except OSError:
        pass
    return None


def fmt(v):
    return "GLIBCXX_" + ".".join(map(str, v)) if v else "no GLIBCXX version"


def runtime_problem(cxx, loaded, loaded_max):
    """Why an extension built by `cxx` would not share torch's C++ runtime, or None."""
    exe = shutil.which(cxx)
    if exe is None:
        return f"`{cxx}` is not found"
    readelf = shutil.which("readelf")
    if readelf is None:
        return None  # binutils without readelf: nothing to read the probe with
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe.so")
        with open(src, "w") as f:
            f.write(PROBE)
        r = subprocess.run(
            [exe, "-shared", "-fPIC", "-O1", src, "-o", lib], capture_output=True, text=True
        )
        if r.returncode != 0:
            return f"`{cxx}` cannot build a C++ shared library: {r.stderr.strip()[-300:]}"
        dyn = subprocess.run(
            [readelf, "-d", "-V", "-W", lib], capture_output=True, text=True
        ).stdout
    if "[libstdc++.so.6]" not in dyn:
        return (
            f"`{cxx}` ({exe}) links libstdc++ statically into the library, so the extension "
            f"would carry a C++ runtime of its own beside the one torch loaded ({loaded})"
        )
    needed = glibcxx_max(dyn)
    own = subprocess.run(
        [exe, "-print-file-name=libstdc++.so.6"], capture_output=True, text=True
    ).stdout.strip()
    own_max = glibcxx_provided(own) if os.path.isabs(own) and os.path.exists(own) else None
    if own_max and os.path.realpath(own) != loaded:
        if own_max > loaded_max:
            return (
                f"`{cxx}` ({exe}) links {os.path.realpath(own)} ({fmt(own_max)}), newer than "
                f"the libstdc++ torch runs with ({loaded}, {fmt(loaded_max)})"
            )
    if needed and needed > loaded_max:
        return (
            f"a library built by `{cxx}` ({exe}) needs {fmt(needed)}, but the libstdc++ torch "
            f"runs with ({loaded}) has at most {fmt(loaded_max)}"
        )
    return None


def c_compiler_for(cxx):
    """The C driver beside a C++ driver (g++-12 -> gcc-12, c++ -> cc, clang++ -> clang), or
    None: nvcc takes its host compiler from CC."""
    exe = shutil.which(cxx)
    if exe is None:
        return None
    folder, name = os.path.split(exe)
    for a, b in (("clang++", "clang"), ("g++", "gcc"), ("c++", "cc")):
        if a in name:
            cc = os.path.join(folder, name.replace(a, b))
            return cc if os.access(cc, os.X_OK) else None
    return None


def check_compiler():
    """Picks the C++ compiler (and nvcc's host compiler) whose libstdc++ is the one torch
    runs with, and pins it through CXX and CC for torch's build; or stops saying which and
    why. With CXX unset: `c++` (torch's default), else the system's /usr/bin/g++."""
    loaded = loaded_libstdcxx()
    if loaded is None:
        return
    loaded_max = glibcxx_provided(loaded)
    chosen = os.environ.get("CXX")
    candidates = [chosen] if chosen else ["c++", "/usr/bin/g++"]
    problems = []
    for cxx in candidates:
        problem = runtime_problem(cxx, loaded, loaded_max)
        if problem is None:
            break
        problems.append(problem)
    else:
        how = (
            "set CXX and CC to a compiler that links it dynamically and is no newer, "
            "e.g. CXX=/usr/bin/g++ CC=/usr/bin/gcc"
            if chosen
            else "install the system g++ (the one torch's libstdc++ comes with) or set CXX and CC"
        )
        stop(
            f"no C++ compiler here links the C++ runtime torch uses ({loaded}); the first "
            f"error an op raises would crash the process. {'; '.join(problems)}. Fix: {how} "
            f"(FUSED_OPS_BUILD_CHECKS=0 builds anyway)"
        )
    if problems:
        print(
            f"fused_ops: building with {cxx} instead of the default: {problems[0]}", file=sys.stderr
        )
    os.environ["CXX"] = cxx
    if "CC" not in os.environ:
        cc = c_compiler_for(cxx)
        if cc is not None:
            os.environ["CC"] = cc  # nvcc's host compiler (-ccbin) and the link driver's C side


# ---------------------------------------------------------------------------------------


def want_cuda(torch, cpp_extension):
    flag = os.environ.get("FUSED_OPS_CUDA")
    if flag is not None:
        return flag == "1"
    return cpp_extension.CUDA_HOME is not None and torch.version.cuda is not None


def version_line(cmd, pattern=r"\S"):
    """The first line of `cmd`'s output that matches pattern (a tool's --version), or None."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return next((line.strip() for line in out.splitlines() if re.search(pattern, line)), None)


def write_build_info(torch, cpp_extension, with_cuda):
    # Read at import (an extension built against one torch must not load under another) and
    # by `python -m fused_ops.info`.
    cxx = os.environ.get("CXX", "c++")
    nvcc = (
        os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
        if (with_cuda and cpp_extension.CUDA_HOME)
        else None
    )
    info = {
        "VERSION": VERSION,
        "TORCH_VERSION": torch.__version__,
        "WITH_CUDA": with_cuda,
        "TORCH_CUDA_VERSION": torch.version.cuda,
        "NVCC": version_line([nvcc, "--version"], r"release \d") if nvcc else None,
        "CUDA_ARCH_LIST": os.environ.get("TORCH_CUDA_ARCH_LIST") if with_cuda else None,
        "CXX": f"{shutil.which(cxx) or cxx}: {version_line([cxx, '--version'])}",
        "CUDA_HOST_CC": os.environ.get("CC") if with_cuda else None,
    }
    with open(os.path.join(HERE, "fused_ops", "_build_info.py"), "w") as f:
        f.write("# Written by setup.py; do not edit.\n")
        for key, value in info.items():
            f.write(f"{key} = {value!r}\n")


def extension(torch, cpp_extension):
    with_cuda = want_cuda(torch, cpp_extension)
    if with_cuda:
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_ARCHS)
    write_build_info(torch, cpp_extension, with_cuda)
    # csrc/*.cpp: the schemas, the overrides and the debug ops; cuda/<op>/plan.cpp: the dispatch
    # tables, plain C++ that the CPU build compiles too (tests/test_plan.py checks them there);
    # autograd/*.cpp: autograd and autocast of every op.
    sources = (
        sorted(glob.glob("csrc/*.cpp"))
        + sorted(glob.glob("csrc/cpu/*.cpp"))
        + sorted(glob.glob("csrc/cuda/*/plan.cpp"))
        + sorted(glob.glob("csrc/autograd/*.cpp"))
    )
    cxx = ["-O3", "-std=c++17"]
    args = {"cxx": cxx}
    macros = []
    if with_cuda:
        sources += sorted(glob.glob("csrc/cuda/**/*.cu", recursive=True))
        args["nvcc"] = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo", "-DNDEBUG"]
        macros.append(("FUSED_OPS_WITH_CUDA", None))
        ext = cpp_extension.CUDAExtension
    else:
        ext = cpp_extension.CppExtension
    return ext(
        name="fused_ops._C",
        sources=sources,
        include_dirs=[os.path.join(HERE, "csrc")],
        extra_compile_args=args,
        define_macros=macros,
        libraries=["cublas"] if with_cuda else [],
    )


def main():
    # pip, `pip wheel` and `python -m build` run this file through setuptools.build_meta, and
    # always end in a wheel; `setup.py build_ext --inplace` needs none.
    if CHECKS and ("setuptools.build_meta" in sys.modules or "bdist_wheel" in sys.argv):
        check_wheel_support()
    torch = import_torch()
    if CHECKS:
        check_compiler()
    from torch.utils import cpp_extension

    setup(
        name="fused_ops",
        version=VERSION,
        description="Fused CUDA kernels registered as torch ops (torch.ops.fused.*)",
        packages=find_packages(include=["fused_ops", "fused_ops.*"]),
        ext_modules=[extension(torch, cpp_extension)],
        cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
        # The extension is compiled against this exact torch (its C++ ABI), so a wheel or an
        # install pins it (the distribution's version: PyPI's CUDA wheel says 2.11.0 where
        # torch.__version__ says 2.11.0+cu130); fused_ops/__init__.py checks it at import.
        install_requires=[f"torch=={importlib.metadata.version('torch')}"],
        python_requires=">=3.10",
        # fused_ops.hf patches Hugging Face models; tested with transformers 5.24.
        extras_require={"hf": [HF_REQUIREMENT]},
    )


# setuptools.build_meta runs this file as __main__ too; tests import it for its checks.
if __name__ == "__main__":
    main()
