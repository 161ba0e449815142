"""One fused norm or softmax forward and torch.compile's kernel for the same composition, in
one process, for Nsight Compute to profile side by side. On the GPU machine:

    PYTHONPATH=$PWD ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats \
        python3 tools/probe_vs_compile.py rms_norm 8192x8192

    TORCH_LOGS=output_code PYTHONPATH=$PWD python3 tools/probe_vs_compile.py ...

(the second prints the Triton source Inductor generated). op: layer_norm, rms_norm or softmax;
bf16.
Only the last fused call and the last compiled call run inside the profiled range.
"""

import sys

import torch

import fused_ops
from fused_ops import reference

op, shape = sys.argv[1], sys.argv[2]
m, n = (int(v) for v in shape.split("x"))
x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
if op == "rms_norm":
    fused = lambda: fused_ops.rms_norm(x, (n,), w)
    compiled = torch.compile(lambda x, w: reference.rms_norm(x, x.shape[-1:], w), dynamic=False)
    comp = lambda: compiled(x, w)
elif op == "layer_norm":
    fused = lambda: fused_ops.layer_norm(x, (n,), w, b)
    compiled = torch.compile(
        lambda x, w, b: reference.layer_norm(x, x.shape[-1:], w, b), dynamic=False
    )
    comp = lambda: compiled(x, w, b)
elif op == "softmax":
    fused = lambda: fused_ops.softmax(x)
    compiled = torch.compile(lambda x: reference.softmax(x), dynamic=False)
    comp = lambda: compiled(x)
else:
    raise SystemExit(f"unknown op {op}")
for _ in range(5):  # compiles, warms both
    fused()
    comp()
torch.cuda.synchronize()
torch.cuda.profiler.start()
fused()
comp()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
