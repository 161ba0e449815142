"""Overrides: the one way to steer the kernels' choice and tuning, for comparisons, tests and
debugging (the default path needs none).

A spec is a comma-separated list of ``key=value`` pairs, e.g. ``"norm.fixed=0,pdl=0"``; the keys
and their values are listed in csrc/common/overrides.h (``norm.*``, ``softmax.*``,
``matmul.kernel``, ``matmul.group_m``, ``pdl``). An unknown key or a bad value raises
RuntimeError naming it. The environment variable ``FUSED_OPS_OVERRIDES`` sets the spec a
process starts with (read once, at the first op call); ``overrides(...)`` changes it for a block::

    from fused_ops.overrides import overrides
    with overrides("matmul.kernel=portable"):
        y = fused_ops.linear(x, w)
"""

import contextlib

import torch

__all__ = ["current", "overrides", "set_spec"]


def current():
    """The spec in force (``""``: every default)."""
    return torch.ops.fused._overrides()


def set_spec(spec):
    """Replace the spec in force with ``spec`` (checked first: a bad spec changes nothing);
    returns the spec that was in force."""
    return torch.ops.fused._set_overrides(spec)


@contextlib.contextmanager
def overrides(spec):
    """Apply ``spec`` on top of the spec in force (a key given again takes the new value) for the
    ``with`` block; the previous spec is restored after it, also on an exception."""
    base = current()
    set_spec(f"{base},{spec}" if base and spec else base or spec)
    try:
        yield
    finally:
        set_spec(base)
