"""dropout (p = 0.1) and bias_dropout_add (residual + dropout(x + bias)), forward and
forward+backward.

Minimum bytes (n = numel, s = element size, H = x.shape[-1]); no mask traffic: the fused
kernels regenerate the mask from a 16-byte seed/offset instead of storing one byte per element.
  dropout           fwd:      read x, write y                               2 n s
                    fwd+bwd:  fwd + read dy, write dx                       4 n s
  bias_dropout_add  fwd:      read x, residual, bias, write out             3 n s + H s
                    fwd+bwd:  fwd + read dy, write dx and dbias             5 n s + 2 H s
                              (d residual = dy itself: no traffic)

What autograd keeps for backward is in each record's fwd_held_bytes (the harness measures
memory held after the forward: outputs plus saved tensors): F.dropout keeps a one-byte mask
per element, the fused op 16 bytes. benchmarks/dropout_memory.py prints the comparison alone.
"""

import math

import torch
import torch.nn.functional as F

import fused_ops
from benchmarks.harness import DECODE_SHAPES, Case
from fused_ops import reference

P = 0.1
# 16384x1024 is 32 MiB in bf16; the others 128 MiB (the >= 64 MB target).
SHAPES = [(16384, 1024), (16384, 4096), (4096, 32768), (8192, 8192)]


def dropout_bytes(shape, dtype, pass_):
    fwd = 2 * math.prod(shape) * dtype.itemsize
    return fwd if pass_ == "fwd" else 2 * fwd


def bias_dropout_add_bytes(shape, dtype, pass_):
    n, h, s = math.prod(shape), shape[-1], dtype.itemsize
    fwd = 3 * n * s + h * s
    return fwd if pass_ == "fwd" else fwd + 2 * n * s + h * s


def _randn(shape, dtype, device):
    return torch.randn(shape, device=device, dtype=torch.float32).to(dtype)


def _dropout_inputs(shape, dtype, device):
    return {"x": _randn(shape, dtype, device)}


def _bda_inputs(shape, dtype, device):
    return {
        "x": _randn(shape, dtype, device),
        "bias": _randn(shape[-1:], dtype, device),
        "residual": _randn(shape, dtype, device),
    }


CASES = [
    Case(
        op="dropout",
        variant=f"p={P}",
        shapes=SHAPES + DECODE_SHAPES,
        quick_shapes=[(16384, 4096)],
        dtypes=[torch.bfloat16, torch.float16, torch.float32],
        passes=("fwd", "fwd+bwd"),
        make_inputs=_dropout_inputs,
        grad_inputs=("x",),
        impls={
            "fused": lambda x: fused_ops.dropout(x, P),
            "native": lambda x: F.dropout(x, P),
            "unfused": lambda x: reference.dropout(x, P),
        },
        bytes=dropout_bytes,
    ),
    Case(
        op="bias_dropout_add",
        variant=f"p={P}",
        shapes=SHAPES + DECODE_SHAPES,
        quick_shapes=[(16384, 4096)],
        dtypes=[torch.bfloat16, torch.float16, torch.float32],
        passes=("fwd", "fwd+bwd"),
        make_inputs=_bda_inputs,
        grad_inputs=("x", "bias", "residual"),
        impls={
            "fused": lambda x, bias, residual: fused_ops.bias_dropout_add(x, bias, residual, P),
            # The three-op composition with PyTorch's own dropout kernel.
            "native": lambda x, bias, residual: residual + F.dropout(x + bias, P),
            "unfused": lambda x, bias, residual: reference.bias_dropout_add(x, bias, residual, P),
        },
        bytes=bias_dropout_add_bytes,
    ),
]
