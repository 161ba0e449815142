"""swiglu and geglu (tanh): silu(gate) * up / gelu(gate) * up, forward and forward+backward.

Minimum bytes (n = numel of gate, s = element size):
  fwd:      read gate, up; write y                                    3 n s
  fwd+bwd:  fwd + backward reading dy, gate, up, writing dgate, dup   3 n s + 5 n s = 8 n s
"""

import math

import torch
import torch.nn.functional as F

import fused_ops
from benchmarks.harness import DECODE_SHAPES, Case
from fused_ops import reference

# [tokens, N] of an MLP's hidden layer: 16384 x 4096 bf16 is 128 MiB an operand.
SHAPES = [(16384, 1024), (16384, 4096), (8192, 14336)]


def gated_bytes(shape, dtype, pass_):
    n = math.prod(shape) * dtype.itemsize
    return 3 * n if pass_ == "fwd" else 8 * n


def _make_inputs(shape, dtype, device):
    def rand():
        return torch.randn(shape, device=device, dtype=torch.float32).to(dtype)

    return {"gate": rand(), "up": rand()}


CASES = [
    Case(
        op="swiglu",
        shapes=SHAPES + DECODE_SHAPES,
        quick_shapes=[(16384, 4096)],
        dtypes=[torch.bfloat16, torch.float16, torch.float32],
        passes=("fwd", "fwd+bwd"),
        make_inputs=_make_inputs,
        grad_inputs=("gate", "up"),
        impls={
            "fused": lambda gate, up: fused_ops.swiglu(gate, up),
            "native": lambda gate, up: F.silu(gate) * up,
            "unfused": lambda gate, up: reference.swiglu(gate, up),
        },
        bytes=gated_bytes,
    ),
    Case(
        op="geglu",
        variant="tanh",
        shapes=SHAPES + DECODE_SHAPES,
        quick_shapes=[(16384, 4096)],
        dtypes=[torch.bfloat16],
        passes=("fwd", "fwd+bwd"),
        make_inputs=_make_inputs,
        grad_inputs=("gate", "up"),
        impls={
            "fused": lambda gate, up: fused_ops.geglu(gate, up, approximate="tanh"),
            "native": lambda gate, up: F.gelu(gate, approximate="tanh") * up,
            "unfused": lambda gate, up: reference.geglu(gate, up, approximate="tanh"),
        },
        bytes=gated_bytes,
    ),
]
