"""Fake (shape-only) kernels and autograd for each op: one module per op, named as the op.

Each module registers, for its ops in torch.ops.fused:
  - torch.library.register_fake: output metadata, so torch.compile and FakeTensor work;
  - torch.library.register_autograd: the backward, which calls the op's registered
    backward op (itself a fused kernel).
"""
from . import gelu  # noqa: F401
from . import norm  # noqa: F401
from . import softmax  # noqa: F401
from . import dropout  # noqa: F401
from . import matmul  # noqa: F401
from . import cross_entropy  # noqa: F401
