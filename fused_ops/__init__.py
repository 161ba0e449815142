"""fused_ops: fused CUDA kernels registered as torch ops (torch.ops.fused.*).

`import fused_ops` loads the compiled extension (which registers every op's schema and
its CPU/CUDA kernels with the dispatcher), then the fake kernels and autograd formulas
(fused_ops/_impl), then exposes the torch.nn.functional-style API.
"""
import torch

try:
    from . import _build_info
except ImportError as e:  # pragma: no cover - only without a build
    raise ImportError(
        "fused_ops is not built: run `pip install --no-build-isolation .` "
        "(or `make build`) in the source tree"
    ) from e

if _build_info.TORCH_VERSION != torch.__version__:
    raise ImportError(
        f"fused_ops was built against torch {_build_info.TORCH_VERSION} but torch "
        f"{torch.__version__} is installed; rebuild it: "
        "pip install --no-build-isolation --force-reinstall --no-deps ."
    )

from . import _C  # noqa: E402,F401  (registers the ops)
from . import _impl  # noqa: E402,F401  (fake kernels and autograd)
from . import nn  # noqa: E402
from . import overrides  # noqa: E402,F401  (fused_ops.overrides: the kernel knobs)
from .functional import *  # noqa: E402,F401,F403
from .functional import __all__ as _functional_all  # noqa: E402

WITH_CUDA = _build_info.WITH_CUDA
__version__ = "0.1.0"
__all__ = list(_functional_all) + ["nn", "WITH_CUDA"]
