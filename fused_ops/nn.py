"""Drop-in modules: same constructor arguments, parameters and state dicts as their torch.nn
twins (extra arguments keyword-only). Each forward calls its functional form (the fastest
entry in eager mode) or, under torch.jit.script (which compiles only that branch), its
registered op; they script wherever the twin does.
"""

from typing import Optional

import torch

from . import functional

__all__ = [
    "GELU",
    "LayerNorm",
    "RMSNorm",
    "Softmax",
    "LogSoftmax",
    "Dropout",
    "Linear",
    "CrossEntropyLoss",
    "DropoutAddLayerNorm",
    "DropoutAddRMSNorm",
    "SwiGLU",
    "GeGLU",
    "MLP",
]


class GELU(torch.nn.GELU):
    """torch.nn.GELU on the fused kernel."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return torch.ops.fused.gelu(input, approximate=self.approximate)
        return functional.gelu(input, self.approximate)


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm on the fused kernel (same arguments, parameters, state dict)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return torch.ops.fused.layer_norm(
                input, list(self.normalized_shape), self.weight, self.bias, self.eps
            )[0]
        return functional.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm on the fused kernel (same arguments, parameters, state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return torch.ops.fused.rms_norm(x, list(self.normalized_shape), self.weight, self.eps)[
                0
            ]
        return functional.rms_norm(x, self.normalized_shape, self.weight, self.eps)


def _legacy_softmax_dim(ndim: int) -> int:
    # What torch.nn.Softmax(dim=None) picks (with a deprecation warning there).
    if ndim == 0 or ndim == 1 or ndim == 3:
        return 0
    return 1


class Softmax(torch.nn.Softmax):
    """torch.nn.Softmax(dim) on the fused kernel."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dim = self.dim
        if dim is None:
            dim = _legacy_softmax_dim(input.dim())
        if torch.jit.is_scripting():
            return torch.ops.fused.softmax(input, dim)
        return functional.softmax(input, dim)


class LogSoftmax(torch.nn.LogSoftmax):
    """torch.nn.LogSoftmax(dim) on the fused kernel."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dim = self.dim
        if dim is None:
            dim = _legacy_softmax_dim(input.dim())
        if torch.jit.is_scripting():
            return torch.ops.fused.log_softmax(input, dim)
        return functional.log_softmax(input, dim)


class Dropout(torch.nn.Dropout):
    """torch.nn.Dropout on the fused kernel (the mask is regenerated in backward, not stored)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return input
        if not self.inplace:
            return torch.ops.fused.dropout(input, self.p, True)[0]
        if torch.is_grad_enabled() and input.requires_grad:
            # An in-place op has no autograd formula: out of place, then copied back.
            return input.copy_(torch.ops.fused.dropout(input, self.p, True)[0])
        torch.ops.fused.dropout_(input, self.p, True)
        return input


class Linear(torch.nn.Linear):
    """torch.nn.Linear with an optional activation ("gelu" or "gelu_tanh") fused into the
    GEMM epilogue: Linear(in_features, out_features, bias=True, device=None, dtype=None, *,
    activation=None). Loads torch.nn.Linear state dicts (same parameters)."""

    activation: Optional[str]

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        activation: Optional[str] = None,
    ):
        if activation not in (None, "gelu", "gelu_tanh"):
            raise ValueError(
                f"activation must be None, 'gelu' or 'gelu_tanh', but got {activation!r}"
            )
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = activation

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        act = self.activation
        if (
            act is not None
            and torch.is_grad_enabled()
            and (
                input.requires_grad
                or self.weight.requires_grad
                or (self.bias is not None and self.bias.requires_grad)
            )
        ):
            # The training op keeps the pre-activation for the backward.
            return torch.ops.fused.linear_fwd(input, self.weight, self.bias, act)[0]
        return torch.ops.fused.linear(input, self.weight, self.bias, act)

    def extra_repr(self) -> str:
        extra = super().extra_repr()
        return extra if self.activation is None else f"{extra}, activation={self.activation!r}"


class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
    """torch.nn.CrossEntropyLoss (class-index targets, classes in the LAST dim of the
    input) on the fused kernel; z_loss and inplace_backward as fused_ops.cross_entropy."""

    def __init__(
        self,
        weight=None,
        size_average=None,
        ignore_index=-100,
        reduce=None,
        reduction="mean",
        label_smoothing=0.0,
        *,
        z_loss=0.0,
        inplace_backward=False,
    ):
        if weight is not None:
            raise ValueError("fused_ops.nn.CrossEntropyLoss: per-class weight is not supported")
        super().__init__(None, size_average, ignore_index, reduce, reduction, label_smoothing)
        self.z_loss = z_loss
        self.inplace_backward = inplace_backward

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return functional.cross_entropy(
            input,
            target,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
            z_loss=self.z_loss,
            inplace_backward=self.inplace_backward,
        )


class _DropoutAdd:
    """What the dropout-add norms add to their torch.nn norm: p and residual_in_fp32."""

    p: float
    residual_in_fp32: bool

    def _dropout_add(self, p: float, residual_in_fp32: bool):
        if p < 0.0 or p > 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.residual_in_fp32 = residual_in_fp32

    def _kw(self, input_bias):
        return dict(
            p=self.p,
            training=self.training,
            input_bias=input_bias,
            residual_in_fp32=self.residual_in_fp32,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, p={self.p}, residual_in_fp32={self.residual_in_fp32}"


class DropoutAddLayerNorm(_DropoutAdd, torch.nn.LayerNorm):
    """s = residual + dropout(input + input_bias, p), then LayerNorm(s): returns (y, s).
    torch.nn.LayerNorm's arguments, parameters and state dict, plus keyword-only p and
    residual_in_fp32; the dropout is active in training mode, as torch.nn.Dropout."""

    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        p: float = 0.0,
        residual_in_fp32: bool = False,
    ):
        torch.nn.LayerNorm.__init__(
            self, normalized_shape, eps, elementwise_affine, bias, device, dtype
        )
        self._dropout_add(p, residual_in_fp32)

    def forward(self, input, residual, input_bias=None):
        ns, w, b = self.normalized_shape, self.weight, self.bias
        kw = self._kw(input_bias)
        return functional.dropout_add_layer_norm(input, residual, ns, w, b, self.eps, **kw)


class DropoutAddRMSNorm(_DropoutAdd, torch.nn.RMSNorm):
    """As DropoutAddLayerNorm with torch.nn.RMSNorm's arguments, parameters and state dict."""

    def __init__(
        self,
        normalized_shape,
        eps: Optional[float] = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        p: float = 0.0,
        residual_in_fp32: bool = False,
    ):
        torch.nn.RMSNorm.__init__(self, normalized_shape, eps, elementwise_affine, device, dtype)
        self._dropout_add(p, residual_in_fp32)

    def forward(self, input, residual, input_bias=None):
        ns, w = self.normalized_shape, self.weight
        kw = self._kw(input_bias)
        return functional.dropout_add_rms_norm(input, residual, ns, w, self.eps, **kw)


class SwiGLU(torch.nn.Module):
    """silu(gate) * up with gate, up = input.chunk(2, dim) (torch.nn has no twin): the
    activation of a gated MLP whose up-projection makes both halves. The halves are read in
    place."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        gate, up = input.chunk(2, self.dim)
        if torch.jit.is_scripting():
            return torch.ops.fused.swiglu(gate, up)
        return functional.swiglu(gate, up)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class GeGLU(torch.nn.Module):
    """gelu(gate, approximate) * up with gate, up = input.chunk(2, dim), as SwiGLU."""

    def __init__(self, approximate: str = "none", dim: int = -1):
        super().__init__()
        self.approximate = approximate
        self.dim = dim

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        gate, up = input.chunk(2, self.dim)
        if torch.jit.is_scripting():
            return torch.ops.fused.geglu(gate, up, approximate=self.approximate)
        return functional.geglu(gate, up, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}, dim={self.dim}"


class MLP(torch.nn.Module):
    """fc2(act(fc1(x))) on fused_ops.mlp (torch.nn has no twin): MLP(in_features,
    hidden_features, out_features=None, bias=True, activation="gelu", device=None,
    dtype=None, *, recompute=False). fc1 is Linear(in, hidden) or, for a gated activation
    ("swiglu", "geglu", "geglu_tanh"), Linear(in, 2 * hidden) with the gate rows first; fc2
    is Linear(hidden, out). Parameters are fc1.weight, fc1.bias, fc2.weight, fc2.bias."""

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        out_features: Optional[int] = None,
        bias: bool = True,
        activation: str = "gelu",
        device=None,
        dtype=None,
        *,
        recompute: bool = False,
    ):
        super().__init__()
        if activation not in functional._MLP_ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {functional._MLP_ACTIVATIONS}, but got {activation!r}"
            )
        out_features = in_features if out_features is None else out_features
        gated = activation in ("swiglu", "geglu", "geglu_tanh")
        fc1_out = 2 * hidden_features if gated else hidden_features
        kw = {"device": device, "dtype": dtype}
        self.fc1 = torch.nn.Linear(in_features, fc1_out, bias, **kw)
        self.fc2 = torch.nn.Linear(hidden_features, out_features, bias, **kw)
        self.activation = activation
        self.recompute = recompute

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        w1, b1, w2, b2 = self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias
        if torch.jit.is_scripting():
            return torch.ops.fused.mlp(input, w1, b1, w2, b2, self.activation, self.recompute)
        return functional.mlp(input, w1, b1, w2, b2, self.activation, recompute=self.recompute)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}, recompute={self.recompute}"
