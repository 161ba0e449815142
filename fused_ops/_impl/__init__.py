"""Fake (shape-only) kernels for each op: one module per op, named as the op.

Each module registers, with torch.library.register_fake, the output metadata of its ops
(shapes, dtypes, strides as the real kernels give them) so torch.compile and FakeTensor
work, and checks devices (a meta tensor beside real ones reaches the fake kernel).
Autograd and autocast are registered in C++ (csrc/autograd/), where they cost least per
call; vmap rules are in vmap.py.
"""
from . import gelu  # noqa: F401
from . import norm  # noqa: F401
from . import softmax  # noqa: F401
from . import dropout  # noqa: F401
from . import matmul  # noqa: F401
from . import cross_entropy  # noqa: F401
from . import vmap  # noqa: F401
