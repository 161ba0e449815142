"""Drop-in modules: same constructor arguments and state dicts as their torch.nn twins."""
import torch

from . import functional as F

__all__ = [
    "GELU",
    "Dropout",
]


class GELU(torch.nn.GELU):
    """torch.nn.GELU on the fused kernel."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.gelu(input, approximate=self.approximate)


class Dropout(torch.nn.Dropout):
    """torch.nn.Dropout on the fused kernel (the mask is regenerated in backward, not stored)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.dropout(input, self.p, self.training, self.inplace)
