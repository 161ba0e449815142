"""matmul and linear (+ bias + gelu_tanh): bf16 GEMMs at LLM sizes, in TFLOP/s.

Shapes are (M, N, K): A is [M, K], B is [K, N] given as the transposed view of a [N, K]
weight (the layout of a linear layer, read in place by every implementation).

FLOPs: fwd 2 M N K; fwd+bwd 3x that (dX = dZ W and dW = dZ^T X are GEMMs of the same size).
Minimum bytes (s = element size):
  fwd:      read A (M K), B (N K), bias (N); write C (M N)          (MK + NK + N + MN) s
  fwd+bwd:  fwd + read dY, Z (2 MN), A, B (MK + NK); write dX, dW, dbias (MK + NK + N)

Extra implementations:
  "portable": the fused op forced onto the portable mma.sync kernel
              (the override matmul.kernel=portable), to report its % of cuBLAS on Hopper; in the
              fwd+bwd pass only the forward is forced (backward runs outside the call).
  "cublaslt": torch._addmm_activation(bias, x, w.t(), use_gelu=True), cuBLASLt's own
              bias + GeLU(tanh) epilogue.

linear swiglu: (M, N, K) with weight [2N, K] and bias [2N], output [M, N] = silu(gate) * up:
FLOPs 2 M (2N) K (fwd), 3x for fwd+bwd; minimum bytes fwd (MK + 2NK + 2N + MN) s, fwd+bwd
that + read dY (MN), z (2MN), X, W; write dX, dW, dbias.
"""

import torch
import torch.nn.functional as F

import fused_ops
from benchmarks.harness import Case
from fused_ops import reference
from fused_ops.overrides import overrides

SHAPES = [
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (16384, 4096, 4096),
    (4096, 16384, 4096),
    (16384, 4096, 16384),
]
QUICK = [(8192, 8192, 8192)]


def _portable(fn):
    def run(**inputs):
        with overrides("matmul.kernel=portable"):
            return fn(**inputs)

    return run


def _flops(shape, pass_):
    m, n, k = shape
    return 2 * m * n * k * (1 if pass_ == "fwd" else 3)


def _bytes(shape, dtype, pass_):
    m, n, k = shape
    s = dtype.itemsize
    fwd = (m * k + n * k + n + m * n) * s
    return fwd if pass_ == "fwd" else fwd + (2 * m * n + 2 * (m * k + n * k) + n) * s


def _rand(*shape, device, dtype, scale=1.0):
    return (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype)


def _matmul_inputs(shape, dtype, device):
    m, n, k = shape
    return {
        "a": _rand(m, k, device=device, dtype=dtype),
        "b": _rand(n, k, device=device, dtype=dtype, scale=k**-0.5).t(),
    }


def _linear_inputs(shape, dtype, device):
    m, n, k = shape
    return {
        "x": _rand(m, k, device=device, dtype=dtype),
        "w": _rand(n, k, device=device, dtype=dtype, scale=k**-0.5),
        "b": _rand(n, device=device, dtype=dtype),
    }


def _fused_matmul(a, b):
    return fused_ops.matmul(a, b)


def _fused_linear(x, w, b):
    return fused_ops.linear(x, w, b, "gelu_tanh")


CASES = [
    Case(
        op="matmul",
        shapes=SHAPES,
        quick_shapes=QUICK,
        dtypes=[torch.bfloat16],
        passes=("fwd",),
        make_inputs=_matmul_inputs,
        impls={
            "fused": _fused_matmul,
            "native": lambda a, b: torch.mm(a, b),
            "unfused": lambda a, b: reference.matmul(a, b),
            "portable": _portable(_fused_matmul),
        },
        bytes=_bytes,
        flops=_flops,
    ),
    Case(
        op="linear",
        variant="bias+gelu_tanh",
        shapes=SHAPES,
        quick_shapes=QUICK,
        dtypes=[torch.bfloat16],
        passes=("fwd", "fwd+bwd"),
        make_inputs=_linear_inputs,
        grad_inputs=("x", "w", "b"),
        impls={
            "fused": _fused_linear,
            "native": lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"),
            "unfused": lambda x, w, b: reference.linear(x, w, b, "gelu_tanh"),
            "cublaslt": lambda x, w, b: torch._addmm_activation(b, x, w.t(), use_gelu=True),
            "portable": _portable(_fused_linear),
        },
        bytes=_bytes,
        flops=_flops,
        fwd_only=("cublaslt",),  # aten::_addmm_activation has no derivative
    ),
]


# The gated linear: shapes (M, N, K), weight [2N, K] (a Llama MLP's fused gate / up projection).
GATED_SHAPES = [(8192, 4096, 4096), (16384, 2048, 2048), (8192, 14336, 4096)]


def _gated_flops(shape, pass_):
    m, n, k = shape
    return 2 * m * (2 * n) * k * (1 if pass_ == "fwd" else 3)


def _gated_bytes(shape, dtype, pass_):
    m, n, k = shape
    s = dtype.itemsize
    fwd = (m * k + 2 * n * k + 2 * n + m * n) * s
    return fwd if pass_ == "fwd" else fwd + (3 * m * n + 2 * (m * k + 2 * n * k) + 2 * n) * s


def _gated_inputs(shape, dtype, device):
    m, n, k = shape
    return _linear_inputs((m, 2 * n, k), dtype, device)


def _fused_swiglu_linear(x, w, b):
    return fused_ops.linear(x, w, b, "swiglu")


def _native_swiglu_linear(x, w, b):
    gate, up = F.linear(x, w, b).chunk(2, -1)
    return F.silu(gate) * up


CASES.append(
    Case(
        op="linear",
        variant="bias+swiglu",
        shapes=GATED_SHAPES,
        quick_shapes=GATED_SHAPES[:1],
        dtypes=[torch.bfloat16],
        passes=("fwd", "fwd+bwd"),
        make_inputs=_gated_inputs,
        grad_inputs=("x", "w", "b"),
        impls={
            "fused": _fused_swiglu_linear,
            "native": _native_swiglu_linear,
            "unfused": lambda x, w, b: reference.linear(x, w, b, "swiglu"),
            "portable": _portable(_fused_swiglu_linear),
        },
        bytes=_gated_bytes,
        flops=_gated_flops,
    )
)
