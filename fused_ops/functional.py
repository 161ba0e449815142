"""The torch.nn.functional-style API: same names, same arguments, fused kernels.

Swap `F.gelu` for `fused_ops.gelu` and nothing else changes.
"""
import torch

ops = torch.ops.fused

__all__ = [
    "gelu",
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "softmax",
    "log_softmax",
]


def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GeLU, as torch.nn.functional.gelu: approximate is 'none' (erf) or 'tanh'."""
    return ops.gelu(input, approximate=approximate)


def _shape(normalized_shape):
    return [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """LayerNorm, as torch.nn.functional.layer_norm (weight/bias in input's dtype or float32)."""
    return ops.layer_norm(input, _shape(normalized_shape), weight, bias, eps)[0]


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """RMSNorm, as torch.nn.functional.rms_norm: eps=None is torch.finfo(input.dtype).eps."""
    return ops.rms_norm(input, _shape(normalized_shape), weight, eps)[0]


def add_layer_norm(input, residual, normalized_shape, weight=None, bias=None, eps=1e-5,
                   residual_in_fp32=False):
    """The pre-norm residual step in one kernel: s = input + residual, returns
    (layer_norm(s), s). s is float32 when residual_in_fp32, else input's dtype."""
    y, s, _, _ = ops.add_layer_norm(input, residual, _shape(normalized_shape), weight, bias, eps,
                                    residual_in_fp32)
    return y, s


def add_rms_norm(input, residual, normalized_shape, weight=None, eps=None,
                 residual_in_fp32=False):
    """As add_layer_norm with rms_norm: returns (rms_norm(s), s), s = input + residual."""
    y, s, _ = ops.add_rms_norm(input, residual, _shape(normalized_shape), weight, eps,
                               residual_in_fp32)
    return y, s
def softmax(input: torch.Tensor, dim: int = -1, *, scale: float = 1.0, causal: bool = False,
            dtype: torch.dtype = None) -> torch.Tensor:
    """softmax(scale * input) along dim, as torch.softmax (default dim: the last).

    causal=True treats the last two dims as (query i, key j) and masks keys j > i before
    the softmax (output 0 there), as scaled_dot_product_attention(is_causal=True); it
    needs dim=-1. With dtype, the input is cast first, as in torch.nn.functional.softmax.
    """
    if dtype is not None:
        input = input.to(dtype)
    return ops.softmax(input, dim, scale=scale, causal=causal)


def log_softmax(input: torch.Tensor, dim: int = -1, *, dtype: torch.dtype = None) -> torch.Tensor:
    """log_softmax along dim, as torch.log_softmax (default dim: the last)."""
    if dtype is not None:
        input = input.to(dtype)
    return ops.log_softmax(input, dim)
