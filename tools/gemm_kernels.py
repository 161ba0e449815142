"""Which kernels cuBLAS / cuBLASLt run for the linear-layer cases (bf16), and one profiled
call of each named case for Nsight Compute (docs/design/matmul.md, "Roofline and standing").

    python tools/gemm_kernels.py names [MxNxK ...]
    ncu --profile-from-start off ... python tools/gemm_kernels.py ncu CASE[,CASE] [MxNxK ...]

`names` prints the CUDA kernels each case launches (torch.profiler, one call after warm-up);
`ncu` warms every named case up, then runs each once between cudaProfilerStart / Stop, so
`ncu --profile-from-start off` sees exactly those launches. cuBLAS's nvjet kernels are
generated at run time (no cubin in libcublasLt to disassemble); their SASS comes from ncu's
source page: `ncu --profile-from-start off --section SourceCounters -o R python
gemm_kernels.py ncu "cublas mm,cublasLt bias+gelu" 16384x4096x4096`, then `ncu -i R.ncu-rep
--page source --print-source sass --csv`.
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from linear_cases import linear_cases

mode, args = sys.argv[1], sys.argv[2:]
wanted = None
if mode == "ncu":
    wanted, args = args[0].split(","), args[1:]
shapes = args or [
    "4096x4096x4096",
    "8192x8192x8192",
    "16384x4096x4096",
    "4096x16384x4096",
    "16384x4096x16384",
]
torch.manual_seed(0)
print(torch.cuda.get_device_name())
for s in shapes:
    _, every = linear_cases(s)
    unknown = set(wanted or ()) - set(every)
    if unknown:
        sys.exit(f"unknown case(s) {sorted(unknown)}; the cases are {list(every)}")
    cases = {n: f for n, f in every.items() if wanted is None or n in wanted}
    for f in cases.values():
        for _ in range(3):
            f()
    torch.cuda.synchronize()
    for name, f in cases.items():
        if mode == "names":
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                f()
                torch.cuda.synchronize()
            kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
            print(f"{s:>16} {name:<24} " + " | ".join(kernels))
        else:
            torch.cuda.profiler.start()
            f()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"{s:>16} {name:<24} profiled")
