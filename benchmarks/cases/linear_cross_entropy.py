"""linear_cross_entropy: the LM head (hidden @ weight.T) and the cross-entropy loss, 'mean'
reduction, forward and forward + backward, at a training step's token count.

Compute-bound (reported in TFLOP/s against the matmul ceiling):
  fwd:      the logits GEMM                                  2 N H V
  fwd+bwd:  + grad_hidden = dlogits W, grad_W = dlogits^T h   6 N H V
Minimum bytes (s = element size): read hidden and weight, (fwd+bwd) write their gradients:
  fwd (N H + V H) s, fwd+bwd 2 (N H + V H) s. What the fused op saves is memory: peak_mem_bytes
in the JSON (the full [N, V] logits and their float32 copies never exist).

native is what Hugging Face models do: F.linear, then F.cross_entropy(logits.float(), t);
compile is torch.compile of it; "liger" is Liger-Kernel's LigerFusedLinearCrossEntropyLoss
where it is installed.
"""

import torch
import torch.nn.functional as F

import fused_ops
from benchmarks.harness import Case, pass_bytes

# (tokens, hidden, vocabulary): Llama 3 8B's head at 8 x 1024 tokens; GPT-2's.
SHAPES = [(8192, 4096, 128256), (8192, 768, 50257)]


def _bytes(shape, dtype, pass_):
    n, h, v = shape
    once = (n * h + v * h) * dtype.itemsize
    return pass_bytes(pass_, once, once)


def _flops(shape, pass_):
    n, h, v = shape
    return {"fwd": 2, "fwd+bwd": 6, "bwd": 4}[pass_] * n * h * v


def _make_inputs(shape, dtype, device):
    n, h, v = shape
    return {
        "hidden": torch.randn(n, h, device=device, dtype=torch.float32).to(dtype),
        "weight": (torch.randn(v, h, device=device, dtype=torch.float32) / h**0.5).to(dtype),
        "target": torch.randint(0, v, (n,), device=device),
    }


def _native(hidden, weight, target):
    return F.cross_entropy(F.linear(hidden, weight).float(), target)


def _impls():
    impls = {
        "fused": lambda hidden, weight, target: fused_ops.linear_cross_entropy(
            hidden, weight, target
        ),
        "native": _native,
        "unfused": _native,
    }
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError:
        return impls
    liger = LigerFusedLinearCrossEntropyLoss()
    impls["liger"] = lambda hidden, weight, target: liger(weight, hidden, target)
    return impls


CASES = [
    Case(
        op="linear_cross_entropy",
        shapes=SHAPES,
        quick_shapes=SHAPES[:1],
        dtypes=[torch.bfloat16],
        passes=("fwd", "fwd+bwd"),
        make_inputs=_make_inputs,
        grad_inputs=("hidden", "weight"),
        impls=_impls(),
        bytes=_bytes,
        flops=_flops,
    ),
]
