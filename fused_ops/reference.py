"""Unfused compositions of PyTorch ops: what the fused kernels replace.

Tests compare the fused ops against these (in float64), and the benchmark times them as
the "unfused" implementation and, through torch.compile, as the "compile" one. Each is
written the way a user would write it without a fused kernel: one PyTorch op per step.
"""

import math

import torch


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3))
        return 0.5 * x * (1.0 + torch.tanh(inner))
    return 0.5 * x * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))


def _norm_dims(normalized_shape):
    n = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
    return tuple(range(-n, 0))


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    dims = _norm_dims(normalized_shape)
    mean = torch.mean(x, dim=dims, keepdim=True)
    centered = x - mean
    var = torch.mean(centered * centered, dim=dims, keepdim=True)
    y = centered * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)


def rms_norm(x, normalized_shape, weight=None, eps=None):
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    dims = _norm_dims(normalized_shape)
    mean_sq = torch.mean(x * x, dim=dims, keepdim=True)
    y = x * torch.rsqrt(mean_sq + eps)
    if weight is not None:
        y = y * weight
    return y.to(x.dtype)


def add_layer_norm(
    x, residual, normalized_shape, weight=None, bias=None, eps=1e-5, residual_in_fp32=False
):
    s = x.float() + residual.float() if residual_in_fp32 else x + residual.to(x.dtype)
    return layer_norm(s, normalized_shape, weight, bias, eps).to(x.dtype), s


def add_rms_norm(x, residual, normalized_shape, weight=None, eps=None, residual_in_fp32=False):
    s = x.float() + residual.float() if residual_in_fp32 else x + residual.to(x.dtype)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    return rms_norm(s, normalized_shape, weight, eps).to(x.dtype), s


def causal_mask(lq: int, lk: int, device=None) -> torch.Tensor:
    """True where key j > query i (masked), as scaled_dot_product_attention(is_causal=True)."""
    return torch.ones(lq, lk, dtype=torch.bool, device=device).triu(1)


def softmax(
    x: torch.Tensor, dim: int = -1, *, scale: float = 1.0, causal: bool = False
) -> torch.Tensor:
    if scale != 1.0:
        x = x * scale
    if causal:
        x = x.masked_fill(causal_mask(x.shape[-2], x.shape[-1], x.device), float("-inf"))
    m = torch.amax(x, dim, keepdim=True)
    e = torch.exp(x - m)
    return e / torch.sum(e, dim, keepdim=True)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    z = x - torch.amax(x, dim, keepdim=True)
    return z - torch.log(torch.sum(torch.exp(z), dim, keepdim=True))


def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    keep = torch.rand_like(x) >= p
    return x * keep * (1.0 / (1.0 - p))


def bias_dropout_add(
    x: torch.Tensor, bias, residual: torch.Tensor, p: float = 0.5, training: bool = True
) -> torch.Tensor:
    h = x + bias if bias is not None else x
    return residual + torch.nn.functional.dropout(h, p, training)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None, activation=None) -> torch.Tensor:
    y = torch.nn.functional.linear(x, weight, bias)
    if activation == "gelu":
        return torch.nn.functional.gelu(y)
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(y, approximate="tanh")
    if activation == "swiglu":
        return swiglu(*y.chunk(2, -1))
    if activation in ("geglu", "geglu_tanh"):
        approximate = "tanh" if activation == "geglu_tanh" else "none"
        return geglu(*y.chunk(2, -1), approximate=approximate)
    return y


def _dropout_add(x, residual, p, training, input_bias, residual_in_fp32, keep):
    """residual + dropout(x + input_bias); keep: the boolean keep mask to apply (the one a
    fused call drew), or None for torch's own dropout."""
    h = x + input_bias if input_bias is not None else x
    if keep is not None and training and p > 0.0:
        h = h * keep * (1.0 / (1.0 - p))
    elif keep is None:
        h = torch.nn.functional.dropout(h, p, training)
    return h.float() + residual.float() if residual_in_fp32 else h + residual.to(x.dtype)


def dropout_add_layer_norm(
    x,
    residual,
    normalized_shape,
    weight=None,
    bias=None,
    eps=1e-5,
    *,
    p=0.0,
    training=True,
    input_bias=None,
    residual_in_fp32=False,
    keep=None,
):
    s = _dropout_add(x, residual, p, training, input_bias, residual_in_fp32, keep)
    return layer_norm(s, normalized_shape, weight, bias, eps).to(x.dtype), s


def dropout_add_rms_norm(
    x,
    residual,
    normalized_shape,
    weight=None,
    eps=None,
    *,
    p=0.0,
    training=True,
    input_bias=None,
    residual_in_fp32=False,
    keep=None,
):
    s = _dropout_add(x, residual, p, training, input_bias, residual_in_fp32, keep)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    return rms_norm(s, normalized_shape, weight, eps).to(x.dtype), s


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return torch.nn.functional.gelu(gate, approximate=approximate) * up
