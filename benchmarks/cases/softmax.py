"""softmax over the last dim (plain, and attention's scaled causal form) and log_softmax,
forward, forward+backward and backward alone.

Minimum bytes (n = numel, s = element size):
  fwd:      read x, write y                                      2 n s
  fwd+bwd:  fwd + backward reading dy and y, writing dx          2 n s + 3 n s = 5 n s
  bwd:      the backward alone                                   3 n s
  causal (last two dims Lq x Lk, keys j > i masked; f = the unmasked fraction,
  (Lq (Lq + 1) / 2) / (Lq Lk) for Lq <= Lk, ~0.5 for square scores):
  fwd:      read the unmasked x, write all of y                  (f + 1) n s
  fwd+bwd:  fwd + backward reading the unmasked dy and y,
            writing all of dx                                    (f + 1) n s + (2 f + 1) n s
  bwd:      the backward alone                                   (2 f + 1) n s
The fused kernels move exactly these bytes (masked keys are never read).
"""

import math

import torch

import fused_ops
from benchmarks.harness import DECODE_SHAPES, PASSES, Case, pass_bytes
from fused_ops import reference

# Row lengths 1K..256K. 16384x4096 and up are >= 128 MiB in bf16 (the >= 64 MB target);
# 1024x131072 is a vocabulary-sized softmax; 256x262144 has only 256 rows (fewer than
# the SMs' worth of 1024-thread blocks: the kernel splits each row over a cluster).
SHAPES = [(16384, 1024), (16384, 4096), (4096, 32768), (1024, 131072), (256, 262144)]
# Attention scores: batch 8, 16 heads, 2048 queries x 2048 keys (1 GiB in bf16). No decode
# rows here: the fused causal mask is aligned top-left (query i keeps keys 0..i), so a
# one-query decode step is the plain softmax above, not this case.
CAUSAL_SHAPES = [(8, 16, 2048, 2048)]
CAUSAL_SCALE = 1 / math.sqrt(128)  # a head dim of 128


def softmax_bytes(shape, dtype, pass_):
    n, s = math.prod(shape), dtype.itemsize
    return pass_bytes(pass_, 2 * n * s, 3 * n * s)


def _unmasked_fraction(lq, lk):
    # Row i keeps keys 0..min(i, Lk - 1).
    kept = sum(min(i + 1, lk) for i in range(lq))
    return kept / (lq * lk)


def causal_bytes(shape, dtype, pass_):
    n, s = math.prod(shape), dtype.itemsize
    f = _unmasked_fraction(shape[-2], shape[-1])
    return int(pass_bytes(pass_, (f + 1) * n * s, (2 * f + 1) * n * s))


def _make_inputs(shape, dtype, device):
    # Logits of a few units: exp neither saturates nor underflows everywhere.
    return {"x": (torch.randn(shape, device=device, dtype=torch.float32) * 3).to(dtype)}


def _make_causal_inputs(shape, dtype, device):
    # The mask is built once here, so native pays only for masked_fill, not for the mask.
    inputs = _make_inputs(shape, dtype, device)
    inputs["mask"] = reference.causal_mask(shape[-2], shape[-1], device)
    return inputs


def _native_causal(x, mask):
    # What attention code writes without a fused kernel: fill, scale, softmax.
    return torch.softmax(x.masked_fill(mask, float("-inf")) * CAUSAL_SCALE, -1)


CASES = [
    Case(
        op="softmax",
        shapes=SHAPES + DECODE_SHAPES,
        quick_shapes=[(16384, 4096), (1024, 131072)],
        dtypes=[torch.bfloat16, torch.float16, torch.float32],
        passes=PASSES,
        make_inputs=_make_inputs,
        grad_inputs=("x",),
        impls={
            "fused": lambda x: fused_ops.softmax(x, -1),
            "native": lambda x: torch.softmax(x, -1),
            "unfused": lambda x: reference.softmax(x, -1),
        },
        bytes=softmax_bytes,
    ),
    Case(
        op="softmax",
        variant="causal",
        shapes=CAUSAL_SHAPES,
        quick_shapes=CAUSAL_SHAPES,
        dtypes=[torch.bfloat16, torch.float16, torch.float32],
        passes=PASSES,
        make_inputs=_make_causal_inputs,
        grad_inputs=("x",),
        impls={
            "fused": lambda x, mask: fused_ops.softmax(x, -1, scale=CAUSAL_SCALE, causal=True),
            "native": _native_causal,
            "unfused": lambda x, mask: reference.softmax(x, -1, scale=CAUSAL_SCALE, causal=True),
        },
        bytes=causal_bytes,
    ),
    Case(
        op="log_softmax",
        shapes=[(16384, 4096), (1024, 131072)] + DECODE_SHAPES,
        quick_shapes=[(16384, 4096)],
        dtypes=[torch.bfloat16, torch.float32],
        passes=PASSES,
        make_inputs=_make_inputs,
        grad_inputs=("x",),
        impls={
            "fused": lambda x: fused_ops.log_softmax(x, -1),
            "native": lambda x: torch.log_softmax(x, -1),
            "unfused": lambda x: reference.log_softmax(x, -1),
        },
        bytes=softmax_bytes,
    ),
]
