"""mlp: a transformer MLP, F.linear -> act -> F.linear, forward and forward+backward (bf16,
TFLOP/s), shape (tokens, C): x [tokens, C], w1 [H, C] (gated: [2H, C]), w2 [C, H], biases.

Variants: "gelu_tanh" with H = 4C; "swiglu" with H = 8C/3 rounded up to a multiple of 256
(Llama's width for the same parameter count: 11008 for C = 4096).

impls:
  fused           fused_ops.mlp: bias + act in the first GEMM's epilogue; backward with act'
                  in the epilogue of the GEMM making dZ (Hopper), dH never in memory
  fused_recompute fused_ops.mlp(recompute=True): keeps no [tokens, H] tensor, recomputes
                  them in the backward with one more GEMM (4/3 of the FLOPs counted below)
  native          eager F.linear -> act -> F.linear (cuBLAS + elementwise kernels)
  unfused         the same composition; compile is torch.compile of it

FLOPs: forward 2 T C (W1 rows + H), forward+backward 3x that. Minimum bytes: the operands
and weights once, plus the [T, H] activations written and read back (what makes the case
not purely compute-bound at small C).
"""

import math

import torch
import torch.nn.functional as F

import fused_ops
from benchmarks.harness import Case

SHAPES = [(8192, 4096), (16384, 1024), (4096, 2048)]
QUICK = [(16384, 1024)]


def dims(shape, act):
    """(tokens, C, H, rows of w1) of a shape."""
    tokens, c = shape
    h = 4 * c if act != "swiglu" else math.ceil(8 * c / 3 / 256) * 256
    return tokens, c, h, 2 * h if act == "swiglu" else h


def _eager(act):
    if act == "swiglu":

        def f(x, w1, b1, w2, b2):
            g, u = F.linear(x, w1, b1).chunk(2, -1)
            return F.linear(F.silu(g) * u, w2, b2)

    else:

        def f(x, w1, b1, w2, b2):
            return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)

    return f


def _inputs(act):
    def make(shape, dtype, device):
        tokens, c, h, rows = dims(shape, act)

        def rand(*s, scale=1.0):
            return (torch.randn(*s, device=device, dtype=torch.float32) * scale).to(dtype)

        return {
            "x": rand(tokens, c),
            "w1": rand(rows, c, scale=c**-0.5),
            "b1": rand(rows, scale=0.1),
            "w2": rand(c, h, scale=h**-0.5),
            "b2": rand(c, scale=0.1),
        }

    return make


def _flops(act):
    def flops(shape, pass_):
        tokens, c, h, rows = dims(shape, act)
        fwd = 2 * tokens * c * (rows + h)
        return fwd if pass_ == "fwd" else 3 * fwd

    return flops


def _bytes(act):
    def nbytes(shape, dtype, pass_):
        tokens, c, h, rows = dims(shape, act)
        io = 2 * tokens * c + rows * c + h * c  # x, y, the weights
        act_elems = tokens * (rows + h)  # Z and H written (forward)
        if pass_ == "fwd":
            return (io + act_elems) * dtype.itemsize
        # backward: dY, dX, dW read / written, Z and H read, dZ written and read twice
        return (2 * io + 2 * act_elems + 3 * tokens * rows) * dtype.itemsize

    return nbytes


def _case(act):
    eager = _eager(act)
    return Case(
        op="mlp",
        variant=act,
        shapes=SHAPES,
        quick_shapes=QUICK,
        dtypes=[torch.bfloat16],
        passes=("fwd", "fwd+bwd"),
        make_inputs=_inputs(act),
        grad_inputs=("x", "w1", "b1", "w2", "b2"),
        impls={
            "fused": lambda x, w1, b1, w2, b2: fused_ops.mlp(x, w1, b1, w2, b2, act),
            "fused_recompute": lambda x, w1, b1, w2, b2: fused_ops.mlp(
                x, w1, b1, w2, b2, act, recompute=True
            ),
            "native": eager,
            "unfused": eager,
        },
        bytes=_bytes(act),
        flops=_flops(act),
    )


CASES = [_case("gelu_tanh"), _case("swiglu")]
