"""dropout_add_layer_norm and dropout_add_rms_norm (p = 0.1, with an input bias): the
post-sublayer residual step s = residual + dropout(x + input_bias), y = norm(s), forward,
forward+backward and backward alone, parameters in x's dtype.

Minimum bytes (M rows x N cols, s = element size; parameters and per-row stats counted):
  fwd:  read x, residual, write y, s                              4MNs + (k + 1)Ns + stats
  bwd:  read dy, d_s, s, write d_residual (= ds) and d_x          5MNs + (2k + 2)Ns + stats
        (d_x = mask * ds / (1 - p): a different tensor from d_residual; d_input_bias and
        dweight / dbias are column sums)
k = 2 parameters for layer norm, 1 for rms norm; the mask is regenerated, never stored.
The native form is `s = residual + F.dropout(x + b, p); F.layer_norm(s)`.
"""

import torch
import torch.nn.functional as F

import fused_ops
from benchmarks.harness import DECODE_SHAPES, PASSES, Case, pass_bytes
from fused_ops import reference

P = 0.1
SHAPES = [(16384, 1024), (16384, 4096), (8192, 8192), (4096, 16384)]
QUICK = [(16384, 4096)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _bytes(layer):
    def count(shape, dtype, pass_):
        m, n = shape
        s = dtype.itemsize
        k = 2 if layer else 1
        stats = (2 if layer else 1) * 4 * m
        fwd = 4 * m * n * s + (k + 1) * n * s + stats
        bwd = 5 * m * n * s + (2 * k + 2) * n * s + stats
        return pass_bytes(pass_, fwd, bwd)

    return count


def _inputs(layer):
    def make(shape, dtype, device):
        n = shape[-1]
        d = {
            "x": torch.randn(shape, device=device).to(dtype),
            "residual": torch.randn(shape, device=device).to(dtype),
            "ib": torch.randn(n, device=device).to(dtype),
            "w": (torch.rand(n, device=device) + 0.5).to(dtype),
        }
        if layer:
            d["b"] = torch.randn(n, device=device).to(dtype)
        return d

    return make


def _native_ln(x, residual, ib, w, b):
    s = residual + F.dropout(x + ib, P)
    return F.layer_norm(s, s.shape[-1:], w, b), s


def _native_rms(x, residual, ib, w):
    s = residual + F.dropout(x + ib, P)
    return F.rms_norm(s, s.shape[-1:], w), s


CASES = [
    Case(
        op="dropout_add_layer_norm",
        variant=f"p={P}",
        shapes=SHAPES + DECODE_SHAPES,
        quick_shapes=QUICK,
        dtypes=DTYPES,
        make_inputs=_inputs(True),
        grad_inputs=("x", "residual", "ib", "w", "b"),
        impls={
            "fused": lambda x, residual, ib, w, b: fused_ops.dropout_add_layer_norm(
                x, residual, x.shape[-1:], w, b, p=P, input_bias=ib
            ),
            "native": _native_ln,
            "unfused": lambda x, residual, ib, w, b: reference.dropout_add_layer_norm(
                x, residual, x.shape[-1:], w, b, p=P, input_bias=ib
            ),
        },
        passes=PASSES,
        bytes=_bytes(True),
    ),
    Case(
        op="dropout_add_rms_norm",
        variant=f"p={P}",
        shapes=SHAPES + DECODE_SHAPES,
        quick_shapes=QUICK,
        dtypes=DTYPES,
        make_inputs=_inputs(False),
        grad_inputs=("x", "residual", "ib", "w"),
        impls={
            "fused": lambda x, residual, ib, w: fused_ops.dropout_add_rms_norm(
                x, residual, x.shape[-1:], w, p=P, input_bias=ib
            ),
            "native": _native_rms,
            "unfused": lambda x, residual, ib, w: reference.dropout_add_rms_norm(
                x, residual, x.shape[-1:], w, p=P, input_bias=ib
            ),
        },
        passes=PASSES,
        bytes=_bytes(False),
    ),
]
