"""Runs one fused op a few times, for Nsight Compute to profile (tools/ncu.sh).

    python tools/probe.py softmax 16384x4096 bwd [bf16]

pass: fwd (the forward op) or bwd (the backward op alone, on a saved y / mean, rstd).
"""

import sys

import torch

import fused_ops  # noqa: F401  (registers torch.ops.fused)

op, shape, pas = sys.argv[1], sys.argv[2], sys.argv[3]
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
    sys.argv[4] if len(sys.argv) > 4 else "bf16"
]
dims = [int(s) for s in shape.split("x")]
F = torch.ops.fused
DEV = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.randn(dims, device=DEV, dtype=dtype)
dy = torch.randn_like(x)
n = dims[-1]
causal = op == "softmax_causal"
if op in ("softmax", "softmax_causal", "log_softmax"):
    fwd = (
        (lambda: F.softmax(x, -1, scale=0.125, causal=causal))
        if op != "log_softmax"
        else (lambda: F.log_softmax(x, -1))
    )
    y = fwd()
    bwd = (
        (lambda: F.softmax_backward(dy, y, -1, scale=0.125, causal=causal))
        if op != "log_softmax"
        else (lambda: F.log_softmax_backward(dy, y, -1))
    )
elif op in ("layer_norm", "rms_norm"):
    w = torch.randn(n, device=DEV, dtype=dtype)
    b = torch.randn(n, device=DEV, dtype=dtype)
    if op == "layer_norm":
        fwd = lambda: F.layer_norm(x, [n], w, b, 1e-5)
    else:
        fwd = lambda: F.rms_norm(x, [n], w, 1e-6)
    out = fwd()
    if op == "layer_norm":
        bwd = lambda: F.layer_norm_backward(dy, x, [n], out[1], out[2], w, b, [True, True])
    else:
        bwd = lambda: F.rms_norm_backward(dy, x, [n], out[1], w, True)
elif op == "dropout":
    fwd = lambda: fused_ops.dropout(x, 0.1, True)
    bwd = None
else:
    raise SystemExit(f"unknown op {op}")
f = fwd if pas == "fwd" else bwd
for _ in range(3):
    f()
if DEV == "cuda":
    torch.cuda.synchronize()
