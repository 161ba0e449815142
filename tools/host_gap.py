"""Is an op's measured time the GPU's or the host's? Times the same call eagerly (events
around each launch sequence, as the harness does) and as a CUDA-graph replay (no host work
between kernels). A large difference means the GPU waits for the host's launches.

    python tools/host_gap.py
"""

import torch
from triton.testing import do_bench, do_bench_cudagraph

import fused_ops  # noqa: F401

F = torch.ops.fused
print(torch.cuda.get_device_name())
for rows, cols in [(16384, 4096), (4096, 12288), (4096, 16384), (4096, 32768)]:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    y, mean, rstd = F.layer_norm(x, [cols], w, b, 1e-5)
    cases = {
        "layer fwd": lambda: F.layer_norm(x, [cols], w, b, 1e-5),
        "layer bwd": lambda: F.layer_norm_backward(dy, x, [cols], mean, rstd, w, b, [True, True]),
    }
    for name, f in cases.items():
        eager = do_bench(f, warmup=25, rep=200, return_mode="median") * 1e3
        graph = do_bench_cudagraph(f, rep=200, return_mode="median") * 1e3
        print(
            f"{rows}x{cols:<6} {name:<10} eager {eager:8.1f} us  graph {graph:8.1f} us  "
            f"gap {eager - graph:+6.1f} us"
        )
