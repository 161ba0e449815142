"""gemm_train: every GEMM of a transformer layer's training step, in the operand layouts
autograd produces, fused_ops against torch.mm on the same views (bf16, TFLOP/s).

For a linear layer y = x W^T with x [tokens, in] and W [out, in] (both contiguous):
  fwd    Y  = X  W^T   M = tokens, N = out, K = in      layout NT
  dgrad  dX = dY W     M = tokens, N = in,  K = out     layout NN
  wgrad  dW = dY^T X   M = out,    N = in,  K = tokens  layout TN
for the qkv (3C x C), out-projection (C x C), MLP-up (4C x C) and MLP-down (C x 4C) weights of
a layer of width C. Records: op "gemm_train", variant the GEMM's kind, shape [M, N, K].

Layout convention (the `layout` field): one letter per operand of C = A B, A first, saying
how the operand is stored relative to its mathematical shape (A is M x K, B is K x N):
  N  stored as written, row-major (A: K contiguous; B: N contiguous),
  T  stored transposed: the operand is the .t() view of a contiguous tensor
     (A: M contiguous; B: K contiguous).
So NT is torch.mm(x, w.t()) (both operands K-major: the forward), NN is torch.mm(dy, w)
(dgrad: B MN-major), TN is torch.mm(dy.t(), x) (wgrad: both MN-major). No copies: every
implementation gets the same views.

impls:
  fused   fused_ops.matmul on the views: the op fused_ops.linear's backward calls for dX and
          dW (csrc/autograd/matmul.cpp), and the forward's GEMM (fused_ops.linear without
          bias or activation runs the same kernel on x and W^T).
  native  torch.mm on the same views (cuBLAS).

Variant "decode": the forward of a few tokens (M = 1, 16, 128) against 4096 x 4096 and
14336 x 4096 weights (memory-bound: the weight is read once), bf16 and fp16. The training variants carry
the field sum="train": benchmarks/run.py adds one summed-time row over them
(harness.summed_records), the set's total as one training step runs it.

FLOPs 2 M N K; minimum bytes (M K + K N + M N) s.
"""

import torch

import fused_ops
from benchmarks.harness import Case

# (tokens, hidden C). (8192, 2048) adds the square 2048 x 2048 weight's gradient over 8192
# tokens (M = N = 2048, K = 8192: 128 tiles of 128 x 256 for 132 SMs).
LAYERS = [(8192, 4096), (16384, 1024), (4096, 8192), (2048, 2048), (8192, 2048)]
QUICK_LAYERS = [(8192, 2048), (16384, 1024)]
# (out, in) of each weight in units of C.
WEIGHTS = {"qkv": (3, 1), "out": (1, 1), "mlp_up": (4, 1), "mlp_down": (1, 4)}
DECODE_M = [1, 16, 128]
DECODE_WEIGHTS = [(4096, 4096), (14336, 4096)]  # [out, in]
QUICK_DECODE = [(1, 4096, 4096), (16, 14336, 4096)]

LAYOUTS = {"fwd": "NT", "dgrad": "NN", "wgrad": "TN", "decode": "NT"}


def gemm_shape(kind, tokens, out, in_):
    """[M, N, K] of one GEMM of a linear layer with a [out, in] weight."""
    return {
        "fwd": (tokens, out, in_),
        "dgrad": (tokens, in_, out),
        "wgrad": (out, in_, tokens),
    }[kind]


def _shapes(kind, layers):
    seen = []
    for tokens, c in layers:
        for o, i in WEIGHTS.values():
            s = gemm_shape(kind, tokens, o * c, i * c)
            if s not in seen:
                seen.append(s)
    return seen


def _rand(*shape, device, dtype, scale=1.0):
    return (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype)


def _operands(kind, shape, dtype, device):
    """(a, b) views of C = A B for the kind's layout, made from contiguous tensors as autograd
    holds them: x [tokens, in], W [out, in], dY [tokens, out]."""
    m, n, k = shape
    if kind in ("fwd", "decode"):  # x [M, K], W [N, K]: A = x, B = W^T
        return _rand(m, k, device=device, dtype=dtype), _rand(
            n, k, device=device, dtype=dtype, scale=k**-0.5
        ).t()
    if kind == "dgrad":  # dY [M, K], W [K, N]: A = dY, B = W
        return _rand(m, k, device=device, dtype=dtype), _rand(
            k, n, device=device, dtype=dtype, scale=k**-0.5
        )
    # wgrad: dY [K, M], x [K, N]: A = dY^T, B = x
    return _rand(k, m, device=device, dtype=dtype).t(), _rand(
        k, n, device=device, dtype=dtype, scale=k**-0.5
    )


def _flops(shape, pass_):
    m, n, k = shape
    return 2 * m * n * k


def _bytes(shape, dtype, pass_):
    m, n, k = shape
    return (m * k + k * n + m * n) * dtype.itemsize


def _case(kind, shapes, quick, dtypes=(torch.bfloat16,)):
    return Case(
        op="gemm_train",
        variant=kind,
        shapes=shapes,
        quick_shapes=quick,
        dtypes=list(dtypes),
        passes=("fwd",),
        make_inputs=lambda shape, dtype, device: dict(
            zip(("a", "b"), _operands(kind, shape, dtype, device))
        ),
        impls={
            "fused": lambda a, b: fused_ops.matmul(a, b),
            "native": lambda a, b: torch.mm(a, b),
        },
        bytes=_bytes,
        flops=_flops,
        fields={"layout": LAYOUTS[kind], **({} if kind == "decode" else {"sum": "train"})},
    )


CASES = [
    _case(kind, _shapes(kind, LAYERS), _shapes(kind, QUICK_LAYERS))
    for kind in LAYOUTS
    if kind != "decode"
]
CASES.append(
    _case(
        "decode",
        [(m, out, in_) for out, in_ in DECODE_WEIGHTS for m in DECODE_M],
        QUICK_DECODE,
        dtypes=(torch.bfloat16, torch.float16),
    )
)
