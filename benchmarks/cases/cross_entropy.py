"""cross_entropy over a language model's vocabulary: [tokens, V] logits, class-index targets,
reduction 'mean', forward and forward + backward.

Bytes (n = tokens * V, s = the logits' element size; the per-row loss, lse and targets
are O(tokens) and left out), the bound of the two-kernel design:
  fwd:      read the logits                                      n s
  fwd+bwd:  + the backward reading the logits again and
            writing their gradient                               n s + 2 n s = 3 n s
"fused_precompute" (precompute_grad=True) writes the gradient in the forward (a read from
HBM, a re-read from L2, a write: 2 n s) and scales it in the backward: nothing for a loss
gradient of exactly 1, another 2 n s otherwise, and the harness's loss gradient is random,
so this table shows its 4 n s case (see docs/design/cross_entropy.md).

native is what Hugging Face models do, F.cross_entropy(logits.float(), target), and the
compile column is torch.compile of the same composition. "fused_inplace" writes the
gradient over the logits in the backward (inplace_backward=True); "liger" is Liger-Kernel's
LigerCrossEntropyLoss (which always does) where it is installed.
"""

import torch
import torch.nn.functional as F

import fused_ops
from benchmarks.harness import DECODE_SHAPES, Case, pass_bytes

# GPT-2 (50257), Llama 3 (128256), Llama 2 (32000), Qwen 2 (151936) vocabularies at the
# token counts of a training step.
SHAPES = [(8192, 50257), (4096, 128256), (8192, 32000), (4096, 151936)]


def xent_bytes(shape, dtype, pass_):
    n, s = shape[0] * shape[1], dtype.itemsize
    return pass_bytes(pass_, n * s, 2 * n * s)


def _make_inputs(shape, dtype, device):
    tokens, vocab = shape
    # Logits of a few units, as an LM head gives; targets all valid (no ignored rows, so
    # every row moves the bytes counted above).
    logits = (torch.randn(shape, device=device, dtype=torch.float32) * 2).to(dtype)
    return {"logits": logits, "target": torch.randint(0, vocab, (tokens,), device=device)}


def _native(logits, target):
    return F.cross_entropy(logits.float(), target)


def _impls():
    impls = {
        "fused": lambda logits, target: fused_ops.cross_entropy(logits, target),
        "native": _native,
        "unfused": _native,
        "fused_precompute": lambda logits, target: fused_ops.cross_entropy(
            logits, target, precompute_grad=True
        ),
        "fused_inplace": lambda logits, target: fused_ops.cross_entropy(
            logits, target, inplace_backward=True
        ),
    }
    try:
        from liger_kernel.transformers import LigerCrossEntropyLoss
    except ImportError:
        return impls
    liger = LigerCrossEntropyLoss()
    impls["liger"] = lambda logits, target: liger(logits, target)
    return impls


CASES = [
    Case(
        op="cross_entropy",
        shapes=SHAPES + DECODE_SHAPES,
        quick_shapes=[(8192, 50257), (4096, 128256)],
        dtypes=[torch.bfloat16, torch.float32],
        passes=("fwd", "fwd+bwd"),
        make_inputs=_make_inputs,
        grad_inputs=("logits",),
        impls=_impls(),
        bytes=xent_bytes,
    ),
]
