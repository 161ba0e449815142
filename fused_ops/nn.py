"""Drop-in modules: same constructor arguments and state dicts as their torch.nn twins."""
import torch

from . import functional as F

__all__ = [
    "GELU",
    "Linear",
]


class GELU(torch.nn.GELU):
    """torch.nn.GELU on the fused kernel."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.gelu(input, approximate=self.approximate)


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
