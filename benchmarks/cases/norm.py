"""layer_norm, rms_norm and the fused pre-norm residual forms (add_layer_norm,
add_rms_norm), forward, forward+backward and backward alone, weight (and bias) in x's dtype.

Minimum bytes (M rows x N cols, s = element size; parameters and per-row stats are small
next to the rows but counted):
  layer_norm fwd:      read x, write y; read w, b                 2MNs + 2Ns
  layer_norm bwd:      read x, dy, write dx; read w, write dw, db 3MNs + 3Ns
                       (+ mean/rstd, 8M, written by fwd and read by bwd)
  rms_norm:            as layer_norm without the bias (Ns less each way) and without mean
  add_*_norm fwd:      read x, residual, write y, sum             4MNs + params
  add_*_norm bwd:      read dy, d_sum, sum, write d_sum (= dx = d_residual, one tensor)
                                                                   4MNs + params
fwd+bwd = fwd + bwd; the bwd pass times the backward alone (its bytes above). The native
residual form is `s = x + residual; F.layer_norm(s)` (what a pre-norm block runs without a
fused kernel).
"""

import torch
import torch.nn.functional as F

import fused_ops
from benchmarks.harness import DECODE_SHAPES, PASSES, Case, pass_bytes
from fused_ops import reference

# tokens x hidden: 16384x1024 is 32 MiB in bf16; the rest are >= 64 MiB (the target size);
# 5120 and 12288 are the common non-power-of-two hidden sizes.
SHAPES = [
    (16384, 1024),
    (16384, 4096),
    (16384, 5120),
    (8192, 8192),
    (4096, 12288),
    (4096, 16384),
    (4096, 32768),
]
QUICK = [(16384, 4096)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _norm_bytes(layer, residual):
    def count(shape, dtype, pass_):
        m, n = shape
        s = dtype.itemsize
        nparams = 2 if layer else 1
        stats = (2 if layer else 1) * 4 * m
        rows_fwd = 4 if residual else 2
        rows_bwd = 4 if residual else 3
        fwd = rows_fwd * m * n * s + nparams * n * s + stats
        bwd = rows_bwd * m * n * s + (1 + nparams) * n * s + stats  # read w; write dw (, db)
        return pass_bytes(pass_, fwd, bwd)

    return count


def _inputs(layer, residual):
    def make(shape, dtype, device):
        n = shape[-1]
        d = {"x": torch.randn(shape, device=device).to(dtype)}
        if residual:
            d["residual"] = torch.randn(shape, device=device).to(dtype)
        d["w"] = (1 + 0.1 * torch.randn(n, device=device)).to(dtype)
        if layer:
            d["b"] = (0.1 * torch.randn(n, device=device)).to(dtype)
        return d

    return make


def _native_add(norm):
    def run(x, residual, **params):
        s = x + residual
        return norm(s, **params), s

    return run


CASES = [
    Case(
        op="layer_norm",
        shapes=SHAPES + DECODE_SHAPES,
        quick_shapes=QUICK,
        dtypes=DTYPES,
        make_inputs=_inputs(True, False),
        grad_inputs=("x", "w", "b"),
        impls={
            "fused": lambda x, w, b: fused_ops.layer_norm(x, x.shape[-1:], w, b),
            "native": lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b),
            "unfused": lambda x, w, b: reference.layer_norm(x, x.shape[-1:], w, b),
        },
        passes=PASSES,
        bytes=_norm_bytes(True, False),
    ),
    Case(
        op="rms_norm",
        shapes=SHAPES + DECODE_SHAPES,
        quick_shapes=QUICK,
        dtypes=DTYPES,
        make_inputs=_inputs(False, False),
        grad_inputs=("x", "w"),
        impls={
            "fused": lambda x, w: fused_ops.rms_norm(x, x.shape[-1:], w),
            "native": lambda x, w: F.rms_norm(x, x.shape[-1:], w),
            "unfused": lambda x, w: reference.rms_norm(x, x.shape[-1:], w),
        },
        passes=PASSES,
        bytes=_norm_bytes(False, False),
    ),
    Case(
        op="add_layer_norm",
        variant="residual",
        shapes=SHAPES + DECODE_SHAPES,
        quick_shapes=QUICK,
        dtypes=DTYPES,
        make_inputs=_inputs(True, True),
        grad_inputs=("x", "residual", "w", "b"),
        impls={
            "fused": lambda x, residual, w, b: fused_ops.add_layer_norm(
                x, residual, x.shape[-1:], w, b
            ),
            "native": _native_add(lambda s, w, b: F.layer_norm(s, s.shape[-1:], w, b)),
            "unfused": lambda x, residual, w, b: reference.add_layer_norm(
                x, residual, x.shape[-1:], w, b
            ),
        },
        passes=PASSES,
        bytes=_norm_bytes(True, True),
    ),
    Case(
        op="add_rms_norm",
        variant="residual",
        shapes=SHAPES + DECODE_SHAPES,
        quick_shapes=QUICK,
        dtypes=DTYPES,
        make_inputs=_inputs(False, True),
        grad_inputs=("x", "residual", "w"),
        impls={
            "fused": lambda x, residual, w: fused_ops.add_rms_norm(x, residual, x.shape[-1:], w),
            "native": _native_add(lambda s, w: F.rms_norm(s, s.shape[-1:], w)),
            "unfused": lambda x, residual, w: reference.add_rms_norm(x, residual, x.shape[-1:], w),
        },
        passes=PASSES,
        bytes=_norm_bytes(False, True),
    ),
]
