"""Drop-in modules: same constructor arguments and state dicts as their torch.nn twins."""
import torch

from . import functional as F

__all__ = [
    "GELU",
]


class GELU(torch.nn.GELU):
    """torch.nn.GELU on the fused kernel."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.gelu(input, approximate=self.approximate)
