"""Build fused_ops: one extension, fused_ops._C, holding every op's CPU and CUDA kernels.

CUDA kernels are compiled when a CUDA toolkit is found (FUSED_OPS_CUDA=0/1 overrides).
Build with `pip install --no-build-isolation .`: the extension must be compiled against the
torch that is already installed, and build isolation would fetch another one.
"""
import glob
import os

from setuptools import find_packages, setup
import torch
from torch.utils import cpp_extension

HERE = os.path.dirname(os.path.abspath(__file__))
# Small default arch list keeps CI builds short: sm_80 (portable kernels, plus PTX for newer
# GPUs) and sm_90a (Hopper-only wgmma/TMA). TORCH_CUDA_ARCH_LIST overrides it.
DEFAULT_ARCHS = "8.0+PTX;9.0a"


def want_cuda():
    flag = os.environ.get("FUSED_OPS_CUDA")
    if flag is not None:
        return flag == "1"
    return cpp_extension.CUDA_HOME is not None and torch.version.cuda is not None


def write_build_info(with_cuda):
    # Read at import: an extension built against one torch must not load under another.
    with open(os.path.join(HERE, "fused_ops", "_build_info.py"), "w") as f:
        f.write("# Written by setup.py; do not edit.\n")
        f.write(f"TORCH_VERSION = {torch.__version__!r}\n")
        f.write(f"WITH_CUDA = {with_cuda!r}\n")


def extension():
    with_cuda = want_cuda()
    write_build_info(with_cuda)
    # csrc/*.cpp: the schemas, the overrides and the debug ops; cuda/<op>/plan.cpp: the dispatch
    # tables, plain C++ that the CPU build compiles too (tests/test_plan.py checks them there).
    sources = (sorted(glob.glob("csrc/*.cpp")) + sorted(glob.glob("csrc/cpu/*.cpp"))
               + sorted(glob.glob("csrc/cuda/*/plan.cpp")))
    cxx = ["-O3", "-std=c++17"]
    args = {"cxx": cxx}
    macros = []
    if with_cuda:
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_ARCHS)
        sources += sorted(glob.glob("csrc/cuda/**/*.cu", recursive=True))
        args["nvcc"] = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo",
                        "-DNDEBUG"]
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


setup(
    name="fused_ops",
    version="0.1.0",
    description="Fused CUDA kernels registered as torch ops (torch.ops.fused.*)",
    packages=find_packages(include=["fused_ops", "fused_ops.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
    python_requires=">=3.9",
)
