"""fused_ops: fused CUDA kernels registered as torch ops (torch.ops.fused.*).

`import fused_ops` loads the compiled extension (which registers every op's schema, its
CPU/CUDA kernels, autograd and autocast with the dispatcher), then the fake kernels and vmap
rules (fused_ops/_impl), then exposes the torch.nn.functional-style API.
"""

import glob as _glob
import os as _os
import sys as _sys
import warnings as _warnings

import torch


def _built_copy_elsewhere():
    """Another fused_ops folder on sys.path that holds a built extension, or None."""
    here = _os.path.realpath(__path__[0])  # noqa: F405  (the package's own __path__)
    for entry in _sys.path:
        folder = _os.path.realpath(_os.path.join(entry or _os.getcwd(), "fused_ops"))
        if folder != here and _glob.glob(_os.path.join(folder, "_C.*")):
            return folder
    return None


# Python run from the source tree after `pip install .` finds this unbuilt folder first (the
# current directory leads sys.path). Its submodules then come from the installed build, so
# the installed extension and the Python code built with it load together.
if not _glob.glob(_os.path.join(__path__[0], "_C.*")):
    _installed = _built_copy_elsewhere()
    if _installed is None:
        raise ImportError(
            "fused_ops is not built: run `pip install --no-build-isolation .` "
            "(or `make build` to build it in place) in the source tree"
        )
    _warnings.warn(
        f"fused_ops: {__path__[0]} (the source tree) has no built extension; using the "
        f"installed fused_ops in {_installed}. Run Python from another folder to import it "
        "directly, or build in place (`make build`) to use the source tree.",
        stacklevel=2,
    )
    __path__[:] = [_installed]

from . import _build_info  # noqa: E402

if _build_info.TORCH_VERSION != torch.__version__:
    raise ImportError(
        f"fused_ops was built against torch {_build_info.TORCH_VERSION} but torch "
        f"{torch.__version__} is installed; rebuild it: "
        "pip install --no-build-isolation --force-reinstall --no-deps ."
    )

# _C registers the ops (and must come first); _impl their fake kernels and vmap rules;
# overrides is the kernel knobs' module.
from . import _C, _impl, nn, overrides  # noqa: E402,F401
from .functional import *  # noqa: E402,F401,F403
from .functional import __all__ as _functional_all  # noqa: E402

WITH_CUDA = _build_info.WITH_CUDA
__version__ = "0.1.0"
__all__ = list(_functional_all) + ["nn", "WITH_CUDA"]

# Applying the library to an existing model: fused_ops.patch(model), fused_ops.hf.patch(model).
from . import hf  # noqa: E402,F401
from .patch import PatchReport, patch, unpatch  # noqa: E402,F401

__all__ += ["patch", "unpatch", "PatchReport", "hf"]
