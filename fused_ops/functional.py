"""The torch.nn.functional-style API: same names, same arguments, fused kernels.

Swap `F.gelu` for `fused_ops.gelu` and nothing else changes.
"""
import torch

ops = torch.ops.fused

__all__ = [
    "gelu",
    "dropout",
    "bias_dropout_add",
]


def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GeLU, as torch.nn.functional.gelu: approximate is 'none' (erf) or 'tanh'."""
    return ops.gelu(input, approximate=approximate)


def _check_dropout_p(p: float) -> None:
    # The same check and message as torch.nn.functional.dropout (a ValueError there too).
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False,
            *, generator: "torch.Generator | None" = None) -> torch.Tensor:
    """Dropout, as torch.nn.functional.dropout, with a counter-based (Philox) mask that is
    never stored: backward regenerates it from a 16-byte seed/offset.

    training=False or p=0 returns `input` itself (no kernel); p=1 returns zeros. The mask is
    drawn from `generator` or the default generator of input's device, so torch.manual_seed
    reproduces it and CUDA-graph replays draw fresh masks. inplace=True writes into `input`;
    when autograd records the call it computes out of place and copies back (an in-place op
    has no autograd formula here), which costs one temporary but still stores no mask."""
    _check_dropout_p(p)
    if not training or p == 0.0:
        return input
    if not inplace:
        return ops.dropout(input, p, True, generator=generator)[0]
    if torch.is_grad_enabled() and input.requires_grad:
        return input.copy_(ops.dropout(input, p, True, generator=generator)[0])
    ops.dropout_(input, p, True, generator=generator)
    return input


def bias_dropout_add(x: torch.Tensor, bias: "torch.Tensor | None", residual: torch.Tensor,
                     p: float = 0.5, training: bool = True, *,
                     generator: "torch.Generator | None" = None) -> torch.Tensor:
    """residual + dropout(x + bias, p, training) in one kernel (bias of shape [x.shape[-1]]
    or None); differentiable in x, bias and residual. Outside training (or p=0) it is the
    fused residual + x + bias, with no randomness drawn."""
    _check_dropout_p(p)
    return ops.bias_dropout_add(x, bias, residual, p, training, generator=generator)[0]
