"""gelu: exact (erf) and tanh forms, forward and forward+backward.

Minimum bytes (n = numel, s = element size):
  fwd:      read x, write y                               2 n s
  fwd+bwd:  fwd + backward reading dy and x, writing dx   2 n s + 3 n s = 5 n s
"""

import math

import torch
import torch.nn.functional as F

import fused_ops
from benchmarks.harness import DECODE_SHAPES, Case
from fused_ops import reference

# 8192x8192 and 4096x32768 are 128 MiB in bf16 (the >= 64 MB target); 16384x1024 is 32 MiB.
SHAPES = [(16384, 1024), (16384, 4096), (4096, 32768), (8192, 8192)]


def gelu_bytes(shape, dtype, pass_):
    size = dtype.itemsize
    fwd = 2 * math.prod(shape) * size
    return fwd if pass_ == "fwd" else fwd + 3 * math.prod(shape) * size


def _make_inputs(shape, dtype, device):
    # Standard normal: the range where gelu is neither identity nor zero.
    return {"x": torch.randn(shape, device=device, dtype=torch.float32).to(dtype)}


def _case(approximate):
    return Case(
        op="gelu",
        variant=approximate,
        shapes=SHAPES + DECODE_SHAPES,
        quick_shapes=[(16384, 4096)],
        dtypes=[torch.bfloat16, torch.float16, torch.float32],
        passes=("fwd", "fwd+bwd"),
        make_inputs=_make_inputs,
        grad_inputs=("x",),
        impls={
            "fused": lambda x: fused_ops.gelu(x, approximate=approximate),
            "native": lambda x: F.gelu(x, approximate=approximate),
            "unfused": lambda x: reference.gelu(x, approximate=approximate),
        },
        bytes=gelu_bytes,
    )


CASES = [_case("none"), _case("tanh")]
