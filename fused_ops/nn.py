"""Drop-in modules: same constructor arguments and state dicts as their torch.nn twins."""
import torch

from . import functional as F

__all__ = [
    "GELU",
    "LayerNorm",
    "RMSNorm",
    "Softmax",
    "LogSoftmax",
    "Dropout",
    "Linear",
]


class GELU(torch.nn.GELU):
    """torch.nn.GELU on the fused kernel."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.gelu(input, approximate=self.approximate)


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm on the fused kernel (same arguments, parameters, state dict)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm on the fused kernel (same arguments, parameters, state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
def _legacy_softmax_dim(ndim: int) -> int:
    # What torch.nn.Softmax(dim=None) picks (with a deprecation warning there).
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(torch.nn.Softmax):
    """torch.nn.Softmax(dim) on the fused kernel."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dim = self.dim if self.dim is not None else _legacy_softmax_dim(input.dim())
        return F.softmax(input, dim)


class LogSoftmax(torch.nn.LogSoftmax):
    """torch.nn.LogSoftmax(dim) on the fused kernel."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dim = self.dim if self.dim is not None else _legacy_softmax_dim(input.dim())
        return F.log_softmax(input, dim)
class Dropout(torch.nn.Dropout):
    """torch.nn.Dropout on the fused kernel (the mask is regenerated in backward, not stored)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.dropout(input, self.p, self.training, self.inplace)
class Linear(torch.nn.Linear):
    """torch.nn.Linear with an optional activation ("gelu" or "gelu_tanh") fused into the
    GEMM epilogue. Loads torch.nn.Linear state dicts (same parameters)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None,
                 activation=None):
        if activation not in (None, "gelu", "gelu_tanh"):
            raise ValueError(
                f"activation must be None, 'gelu' or 'gelu_tanh', but got {activation!r}")
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = activation

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        extra = super().extra_repr()
        return extra if self.activation is None else f"{extra}, activation={self.activation!r}"
class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
    """torch.nn.CrossEntropyLoss (class-index targets, classes in the LAST dim of the
    input) on the fused kernel; z_loss and inplace_backward as fused_ops.cross_entropy."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction="mean", label_smoothing=0.0, *, z_loss=0.0, inplace_backward=False):
        if weight is not None:
            raise ValueError("fused_ops.nn.CrossEntropyLoss: per-class weight is not supported")
        super().__init__(None, size_average, ignore_index, reduce, reduction, label_smoothing)
        self.z_loss = z_loss
        self.inplace_backward = inplace_backward

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(input, target, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing,
                               z_loss=self.z_loss, inplace_backward=self.inplace_backward)
__all__ += ["CrossEntropyLoss"]
