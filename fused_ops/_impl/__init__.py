"""Fake (shape-only) kernels for each op: one module per op, named as the op.

Each module registers, with torch.library.register_fake, the output metadata of its ops
(shapes, dtypes, strides as the real kernels give them) so torch.compile and FakeTensor
work, and checks devices (a meta tensor beside real ones reaches the fake kernel).
Autograd and autocast are registered in C++ (csrc/autograd/), where they cost least per
call; vmap rules are in vmap.py.
"""

from . import (
    cross_entropy,  # noqa: F401
    dropout,  # noqa: F401
    gated,  # noqa: F401
    gelu,  # noqa: F401
    matmul,  # noqa: F401
    mlp,  # noqa: F401
    norm,  # noqa: F401
    softmax,  # noqa: F401
    vmap,  # noqa: F401
)
