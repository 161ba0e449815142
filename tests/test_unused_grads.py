"""Ops whose extra outputs take no gradient (the norms' mean / rstd, dropout's
seed_offset, linear_fwd's pre-activation): their backward must not have autograd fill a
zero tensor for each such output (a kernel each, on every backward; an M x N one for the
pre-activation), and must stay correct when one of the differentiable outputs is unused
(its gradient then arrives as None)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fused_ops

from utils import DEVICES, assert_close

ZERO_FILLS = {
    "aten.zeros.default",
    "aten.zero_.default",
    "aten.fill_.Scalar",
    "aten.zeros_like.default",
    "aten.new_zeros.default",
    "aten.full.default",
}


class Ops(TorchDispatchMode):
    """Records (op name, shape of the first tensor argument or result) of every aten call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shape = out.shape if isinstance(out, torch.Tensor) else None
        self.calls.append((str(func), tuple(shape) if shape is not None else None))
        return out


def _fills_in_backward(outputs, inputs):
    """The zero fills torch.autograd.grad runs for these outputs (random gradients for the
    tensors in `outputs`), as (op, shape)."""
    grads = [torch.randn_like(o) for o in outputs]
    with Ops() as rec:
        torch.autograd.grad(outputs, inputs, grads, allow_unused=True)
    return [c for c in rec.calls if c[0] in ZERO_FILLS]


def _leaf(*shape, device, dtype=torch.float32):
    return torch.randn(*shape, device=device, dtype=dtype).requires_grad_()


@pytest.mark.parametrize("device", DEVICES)
def test_no_zero_fills_for_outputs_without_gradient(device):
    m, n, k = 12, 40, 24
    x, r = _leaf(m, n, device=device), _leaf(m, n, device=device)
    w, b = _leaf(n, device=device), _leaf(n, device=device)
    rows = (m,)  # mean / rstd shape
    cases = {
        "layer_norm": lambda: [fused_ops.layer_norm(x, (n,), w, b)],
        "rms_norm": lambda: [fused_ops.rms_norm(x, (n,), w)],
        "add_layer_norm": lambda: list(fused_ops.add_layer_norm(x, r, (n,), w, b)),
        "add_rms_norm": lambda: list(fused_ops.add_rms_norm(x, r, (n,), w)),
        "dropout": lambda: [fused_ops.dropout(x, 0.25, True)],
        "bias_dropout_add": lambda: [fused_ops.bias_dropout_add(x, b, r, 0.25, True)],
    }
    for name, run in cases.items():
        fills = _fills_in_backward(run(), [x, r, w, b])
        # The CPU kernels zero their own dweight / dbias accumulators ([n]); what must not
        # appear is a fill shaped like mean / rstd, seed_offset or a full row block.
        bad = [f for f in fills if f[1] in (rows, (2,), (m, n))]
        assert not bad, f"{name}: zero fills for outputs without gradient: {bad}"
    wl, bl = _leaf(n, k, device=device), _leaf(n, device=device)
    xl = _leaf(m, k, device=device)
    y = fused_ops.linear(xl, wl, bl, activation="gelu_tanh")
    bad = [f for f in _fills_in_backward([y], [xl, wl, bl]) if f[1] == (m, n)]
    assert not bad, f"linear: a zero fill of the pre-activation's shape: {bad}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("used", ["normed", "sum"])
def test_add_norm_one_output_used(device, kind, used):
    # Only one of (normed, sum) reaches the loss: the other's gradient arrives as None.
    m, n = 7, 48
    x, r = _leaf(m, n, device=device), _leaf(m, n, device=device)
    w, b = _leaf(n, device=device), _leaf(n, device=device)
    if kind == "layer":
        normed, s = fused_ops.add_layer_norm(x, r, (n,), w, b)
    else:
        normed, s = fused_ops.add_rms_norm(x, r, (n,), w)
    params = [w, b] if kind == "layer" else [w]
    out = normed if used == "normed" else s
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, r, *params], g, allow_unused=True)

    xd, rd = x.detach().double().requires_grad_(), r.detach().double().requires_grad_()
    pd = [p.detach().double().requires_grad_() for p in params]
    sd = xd + rd
    if kind == "layer":
        ref_out = torch.nn.functional.layer_norm(sd, (n,), *pd) if used == "normed" else sd
    else:
        ref_out = (
            torch.nn.functional.rms_norm(sd, (n,), pd[0], eps=torch.finfo(torch.float32).eps)
            if used == "normed"
            else sd
        )
    want = torch.autograd.grad(ref_out, [xd, rd, *pd], g.double(), allow_unused=True)
    for name, a, e in zip(["x", "residual", "weight", "bias"], got, want):
        if e is None:  # the sum alone does not depend on the parameters
            assert a is None or not a.any(), f"{name}: expected no gradient"
        else:
            assert_close(a, e, dtype=torch.float32, msg=f"{kind} {used}: d{name}")
