"""layer_norm, rms_norm, add_layer_norm, add_rms_norm: forward, backward, autograd, compile,
errors. Everything is compared with float64 compositions (fused_ops.reference).

Gradients are checked against a bound built from the magnitudes of the summed terms
(|err| <= atol + rtol * sum |term|): a float32 row or column sum is only as exact as that
bound allows, whatever the summation order, so this is the honest tolerance for dx, dweight
and dbias (outputs use the plain per-dtype tolerance).
"""

import re

import pytest
import torch
import torch.nn.functional as F

import fused_ops
from fused_ops import reference

from utils import (
    CUDA,
    DEVICES,
    DTYPES,
    TOL,
    assert_close,
    assert_graph_replay_matches_eager,
    cuda_kernel_names,
    input_views,
    kernel_template_args,
    offset_copy,
    overrides,
    poison_next_alloc,
)

ops = torch.ops.fused
KINDS = ["layer", "rms"]
# norm_fwd_regs' template parameters after its types, in order.
FWD_REGS_PARAMS = ("VEC", "VPT", "LAYER", "RES", "FIXED_TPR", "DROP", "SPAN")


def _fwd_regs(name):
    """norm_fwd_regs' integer template arguments of a kernel name ({"VPT": 8, ...}), or None
    for another kernel."""
    args = kernel_template_args(name, "norm_fwd_regs")
    return None if args is None else dict(zip(FWD_REGS_PARAMS, map(int, args[3:]), strict=True))


# ---- float64 references -------------------------------------------------------------------


def _eps(kind, dtype, eps=None):
    if eps is not None:
        return eps
    return 1e-5 if kind == "layer" else torch.finfo(dtype).eps


def ref_forward(kind, x, ns, w, b, eps):
    """float64 (y, mean, rstd) of x (any dtype: taken exactly as float64)."""
    x = x.double()
    dims = tuple(range(-len(ns), 0))
    w = None if w is None else w.double()
    b = None if b is None else b.double()
    if kind == "layer":
        y = reference.layer_norm(x, ns, w, b, eps)
        mean = x.mean(dim=dims)
        var = ((x - x.mean(dim=dims, keepdim=True)) ** 2).mean(dim=dims)
    else:
        y = reference.rms_norm(x, ns, w, eps)
        mean = None
        var = (x * x).mean(dim=dims)
    return y, mean, torch.rsqrt(var + eps)


def ref_grads(kind, x, dy, ns, w, b, eps, dsum=None):
    """float64 (dx, dweight, dbias), their magnitude bounds (same sums over |terms|), and
    dweight's absolute slack for the float32 mean (layer norm; 0 otherwise).

    The mean is saved in float32 for every x dtype (the API), and its rounding, a few ulps of
    |mean|, moves a whole row's xhat by up to |mean| rstd 2^-22 whatever xhat is: dweight, a
    sum over rows of dy xhat, carries sum_rows |dy| |mean| rstd 2^-22 of it, which no multiple
    of sum_rows |dy xhat| covers where xhat is small on a row far from zero (_far_row; seen
    as 2 of 40008 float32 dweights past the bound by 6.5e-7 in test_cuda_add_wide_forward,
    float16 x, 40008 columns)."""
    x64 = x.double().requires_grad_()
    w64 = None if w is None else w.double().requires_grad_()
    b64 = None if b is None else b.double().requires_grad_()
    y, _, rstd = ref_forward(kind, x64, ns, w64, b64, eps)
    dy64 = dy.double()
    y.backward(dy64)
    dx = x64.grad + (0 if dsum is None else dsum.double())
    dims = tuple(range(-len(ns), 0))
    rows = tuple(range(x.dim() - len(ns)))
    with torch.no_grad():
        xd = x.double()
        mean = xd.mean(dim=dims, keepdim=True) if kind == "layer" else 0.0
        r = rstd.reshape(rstd.shape + (1,) * len(ns))
        xhat = (xd - mean) * r
        g = dy64 * (1.0 if w is None else w.double())
        avg = lambda t: t.mean(dim=dims, keepdim=True)  # noqa: E731
        mag_dx = r * (
            g.abs() + (avg(g.abs()) if kind == "layer" else 0) + xhat.abs() * avg((g * xhat).abs())
        )
        if dsum is not None:
            mag_dx = mag_dx + dsum.double().abs()
        sum_rows = (lambda t: t.sum(dim=rows)) if rows else (lambda t: t)  # noqa: E731
        mag_dw = sum_rows((dy64 * xhat).abs())
        mag_db = sum_rows(dy64.abs())
        # Rows of one value (variance 0, n = 1) are left out: their mean is exact, and rstd
        # = eps^-1/2 would make the slack large where the kernels must give xhat = 0.
        spread = (xhat.abs().amax(dim=dims, keepdim=True) > 0).double()
        slack_dw = (
            sum_rows(dy64.abs() * r * abs(mean) * spread) * 2.0**-22
            if kind == "layer" and x.dtype != torch.float64
            else 0.0
        )
    dw = None if w64 is None else w64.grad
    db = None if b64 is None else b64.grad
    return (dx, dw, db), (mag_dx, mag_dw, mag_db), slack_dw


def assert_within(actual, ref, mag, dtype, msg="", slack=0.0):
    """|actual - ref| <= atol + rtol * mag + slack elementwise (NaN/inf never pass)."""
    rtol, atol = TOL[dtype]
    a, r, m = actual.double().cpu(), ref.double().cpu(), mag.double().cpu()
    if isinstance(slack, torch.Tensor):
        slack = slack.double().cpu()
    assert a.shape == r.shape, f"{msg}: shape {tuple(a.shape)} != {tuple(r.shape)}"
    assert torch.isfinite(a).all(), f"{msg}: non-finite values"
    excess = (a - r).abs() - (atol + rtol * m + slack)
    bad = excess > 0
    assert not bad.any(), (
        f"{msg}: {int(bad.sum())} of {bad.numel()} elements off, worst "
        f"excess {excess.max().item():.3g} at {tuple(bad.nonzero()[0].tolist())}"
    )


def _params(kind, ns, dtype, device, wdtype="same", bias=True):
    """weight / bias per config: 'same' (x's dtype), 'fp32', or None."""
    if wdtype is None:
        return None, None
    pd = dtype if wdtype == "same" else torch.float32
    w = (1 + 0.5 * torch.randn(ns, device=device)).to(pd)
    b = (0.5 * torch.randn(ns, device=device)).to(pd) if (kind == "layer" and bias) else None
    return w, b


def fused_forward(kind, x, ns, w, b, eps):
    if kind == "layer":
        return ops.layer_norm(x, ns, w, b, eps)
    y, rstd = ops.rms_norm(x, ns, w, eps)
    return y, None, rstd


def check_forward(kind, x, ns, w, b, eps=None, msg=""):
    eps = _eps(kind, x.dtype, eps)
    poison_next_alloc(x.numel() * x.element_size(), x.device)
    y, mean, rstd = fused_forward(kind, x, ns, w, b, eps)
    ry, rmean, rrstd = ref_forward(kind, x, ns, w, b, eps)
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
    assert_close(y, ry, dtype=x.dtype, msg=f"y {msg}")
    stat_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    assert rstd.dtype == stat_dtype and rstd.shape == x.shape[: x.dim() - len(ns)]
    assert_close(rstd, rrstd, dtype=stat_dtype, msg=f"rstd {msg}")
    if kind == "layer":
        assert mean.dtype == stat_dtype and mean.shape == rstd.shape
        assert_close(mean, rmean, dtype=stat_dtype, atol=1e-5, msg=f"mean {msg}")
    return y, mean, rstd


def check_backward(kind, x, ns, w, b, eps=None, msg=""):
    """The backward op against float64, then the same through autograd."""
    eps = _eps(kind, x.dtype, eps)
    _, mean, rstd = fused_forward(kind, x, ns, w, b, eps)
    dy = torch.randn(x.shape, device=x.device).to(x.dtype)
    (rdx, rdw, rdb), (mdx, mdw, mdb), sdw = ref_grads(kind, x, dy, ns, w, b, eps)
    poison_next_alloc(x.numel() * x.element_size(), x.device)
    if kind == "layer":
        dx, dw, db = ops.layer_norm_backward(dy, x, ns, mean, rstd, w, b, [True, True])
    else:
        dx, dw = ops.rms_norm_backward(dy, x, ns, rstd, w, True)
        db = torch.empty(0)
    assert dx.dtype == x.dtype and dx.shape == x.shape
    assert_within(dx, rdx, mdx, x.dtype, f"dx {msg}")
    if w is None:
        assert dw.numel() == 0
    else:
        assert dw.dtype == w.dtype and dw.shape == w.shape
        assert_within(dw, rdw, mdw, w.dtype, f"dweight {msg}", slack=sdw)
    if b is None:
        assert db.numel() == 0
    else:
        assert db.dtype == b.dtype
        assert_within(db, rdb, mdb, b.dtype, f"dbias {msg}")
    # Autograd, through the functional API.
    xa = x.detach().clone().requires_grad_()
    wa = None if w is None else w.detach().clone().requires_grad_()
    ba = None if b is None else b.detach().clone().requires_grad_()
    if kind == "layer":
        y = fused_ops.layer_norm(xa, ns, wa, ba, eps)
    else:
        y = fused_ops.rms_norm(xa, ns, wa, eps)
    y.backward(dy)
    assert_within(xa.grad, rdx, mdx, x.dtype, f"autograd dx {msg}")
    if w is not None:
        assert_within(wa.grad, rdw, mdw, w.dtype, f"autograd dweight {msg}", slack=sdw)
    if b is not None:
        assert_within(ba.grad, rdb, mdb, b.dtype, f"autograd dbias {msg}")


def check_add(kind, x, residual, ns, w, b, residual_in_fp32, eps=None, msg=""):
    """add_layer_norm / add_rms_norm forward and backward (dx, d_residual, dweight, dbias)."""
    eps = _eps(kind, x.dtype, eps)
    sum_dtype = torch.float32 if residual_in_fp32 and x.dtype != torch.float64 else x.dtype
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    s_ref = (x.to(acc) + residual.to(acc)).to(sum_dtype)  # what the unfused sum holds
    xa = x.detach().clone().requires_grad_()
    ra = residual.detach().clone().requires_grad_()
    wa = None if w is None else w.detach().clone().requires_grad_()
    ba = None if b is None else b.detach().clone().requires_grad_()
    poison_next_alloc(x.numel() * x.element_size(), x.device)
    if kind == "layer":
        y, s = fused_ops.add_layer_norm(xa, ra, ns, wa, ba, eps, residual_in_fp32)
    else:
        y, s = fused_ops.add_rms_norm(xa, ra, ns, wa, eps, residual_in_fp32)
    assert s.dtype == sum_dtype and y.dtype == x.dtype
    assert_close(s, s_ref, dtype=sum_dtype, msg=f"sum {msg}")
    ry, _, _ = ref_forward(kind, s_ref, ns, w, b, eps)
    assert_close(y, ry, dtype=x.dtype, msg=f"y {msg}")
    dy = torch.randn(x.shape, device=x.device).to(x.dtype)
    dsum = torch.randn(x.shape, device=x.device).to(sum_dtype)
    (rds, rdw, rdb), (mds, mdw, mdb), sdw = ref_grads(kind, s_ref, dy, ns, w, b, eps, dsum=dsum)
    torch.autograd.backward([y, s], [dy, dsum])
    assert xa.grad.dtype == x.dtype and ra.grad.dtype == residual.dtype
    assert_within(xa.grad, rds, mds, x.dtype, f"dx {msg}")
    assert_within(
        ra.grad,
        rds,
        mds,
        residual.dtype if residual.dtype != torch.float32 else sum_dtype,
        f"d_residual {msg}",
    )
    if w is not None:
        assert_within(wa.grad, rdw, mdw, w.dtype, f"dweight {msg}", slack=sdw)
    if b is not None:
        assert_within(ba.grad, rdb, mdb, b.dtype, f"dbias {msg}")


# ---- forward / backward over shapes, views, parameter configs ------------------------------

# (shape, normalized_shape): odd sizes, a single element, multi-dim normalized shapes.
SHAPES = [
    ((1,), (1,)),
    ((3, 7), (7,)),
    ((5, 64), (64,)),
    ((4, 1000), (1000,)),
    ((2, 3, 515), (515,)),
    ((2, 3, 4, 5), (4, 5)),
    ((2, 3, 4, 6), (3, 4, 6)),
    ((33, 257), (257,)),
]
WCONFIGS = ["same", "fp32", None]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape,ns", SHAPES)
def test_forward_matches_float64(device, dtype, kind, shape, ns):
    for wcfg in WCONFIGS:
        w, b = _params(kind, ns, dtype, device, wcfg)
        for name, x in input_views(shape, dtype, device, scale=2.0):
            check_forward(kind, x + 0.5, list(ns), w, b, msg=f"view={name} weight={wcfg}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape,ns", SHAPES)
def test_backward_matches_float64(device, dtype, kind, shape, ns):
    for wcfg in WCONFIGS:
        w, b = _params(kind, ns, dtype, device, wcfg)
        for name, x in input_views(shape, dtype, device, scale=2.0):
            check_backward(kind, x + 0.5, list(ns), w, b, msg=f"view={name} weight={wcfg}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_weight_only_and_bias_only(device, dtype, kind):
    x = torch.randn(6, 40, device=device).to(dtype)
    w, b = _params(kind, (40,), dtype, device, "same")
    check_forward(kind, x, [40], w, None, msg="weight only")
    check_backward(kind, x, [40], w, None, msg="weight only")
    if kind == "layer":
        check_forward(kind, x, [40], None, b, msg="bias only")
        check_backward(kind, x, [40], None, b, msg="bias only")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_misaligned_parameters(device, dtype, kind):
    # weight / bias views one element into their storage: the span path forward (parameters
    # loaded at a shift), the scalar backward.
    n = 96
    buf = (1 + torch.randn(2 * n + 2, device=device)).to(dtype)
    w, b = buf[1 : n + 1], (buf[n + 2 :] if kind == "layer" else None)
    x = torch.randn(7, n, device=device).to(dtype)
    check_forward(kind, x, [n], w, b, msg="misaligned params")
    check_backward(kind, x, [n], w, b, msg="misaligned params")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_large_mean_rows(device, dtype, kind):
    # Rows far from zero: E[x^2] - E[x]^2 in float32 loses the variance entirely here.
    # float32 x (std 1 at mean 1e4): the mean itself is only known to ~1e4 * 2^-24 per
    # element, so y is held to 2e-3 absolute; 16-bit rows are spread wider (bf16 spacing at
    # 1e4 is 64).
    std = 1.0 if dtype == torch.float32 else 300.0
    x = (1e4 + std * torch.randn(8, 1024, device=device)).to(dtype)
    w, b = _params(kind, (1024,), dtype, device, "same")
    eps = _eps(kind, dtype)
    y, _, _ = fused_forward(kind, x, [1024], w, b, eps)
    ry, _, _ = ref_forward(kind, x, [1024], w, b, eps)
    rtol, atol = TOL[dtype]
    assert_close(y, ry, dtype=dtype, rtol=rtol, atol=2e-3 if dtype == torch.float32 else atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_constant_rows(device, dtype, kind):
    # Variance 0: y is exactly the bias (layer norm), nothing is NaN. 1.5 is dyadic, so any
    # summation order gets the mean exactly.
    # 20000: register forward + cluster backward on sm_90; 70000: the long-row kernels.
    for n in (1, 8, 1000, 4096, 20000, 70000):
        x = torch.full((3, n), 1.5, device=device, dtype=dtype)
        w, b = _params(kind, (n,), dtype, device, "same")
        check_forward(kind, x, [n], w, b, msg=f"constant n={n}")
        check_backward(kind, x, [n], w, b, msg=f"constant n={n}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("residual_in_fp32", [False, True])
def test_add_norm_matches_float64(device, dtype, kind, residual_in_fp32):
    for shape, ns in [((3, 7), (7,)), ((4, 1000), (1000,)), ((2, 3, 4, 6), (4, 6))]:
        for rdtype in {dtype, torch.float32}:
            w, b = _params(kind, ns, dtype, device, "same")
            for name, x in input_views(shape, dtype, device):
                r = torch.randn(shape, device=device).to(rdtype)
                check_add(
                    kind,
                    x,
                    r,
                    list(ns),
                    w,
                    b,
                    residual_in_fp32,
                    msg=f"view={name} residual={rdtype}",
                )


@pytest.mark.parametrize("device", DEVICES)
def test_add_norm_float32_params_and_grad_sum_none(device):
    x = torch.randn(5, 48, device=device).to(torch.bfloat16)
    r = torch.randn(5, 48, device=device)
    w, b = _params("layer", (48,), torch.bfloat16, device, "fp32")
    check_add("layer", x, r, [48], w, b, True, msg="fp32 params")
    # Only the normalized output used: grad_sum arrives as None (or zeros).
    y, s, mean, rstd = ops.add_layer_norm(x, r, [48], w, b, 1e-5, True)
    dy = torch.randn_like(x)
    ds_none, _, _ = ops.add_layer_norm_backward(dy, None, s, [48], mean, rstd, w, b, [True, True])
    ds_zero, _, _ = ops.add_layer_norm_backward(
        dy, torch.zeros_like(s), s, [48], mean, rstd, w, b, [True, True]
    )
    torch.testing.assert_close(ds_none, ds_zero)


@pytest.mark.parametrize("device", DEVICES)
def test_masked_param_grads(device):
    x = torch.randn(4, 16, device=device)
    w, b = _params("layer", (16,), torch.float32, device, "same")
    y, mean, rstd = ops.layer_norm(x, [16], w, b, 1e-5)
    dy = torch.randn_like(x)
    dx, dw, db = ops.layer_norm_backward(dy, x, [16], mean, rstd, w, b, [False, True])
    assert dw.numel() == 0 and db.shape == (16,)
    dx2, dw2, db2 = ops.layer_norm_backward(dy, x, [16], mean, rstd, w, b, [True, False])
    assert dw2.shape == (16,) and db2.numel() == 0
    torch.testing.assert_close(dx, dx2)
    # A parameter that does not require grad gets none through autograd.
    xa = x.clone().requires_grad_()
    fused_ops.layer_norm(xa, [16], w, b.clone().requires_grad_()).sum().backward()
    assert xa.grad is not None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_matches_torch_functional(device, kind):
    x = torch.randn(8, 5, 24, device=device)
    w = torch.randn(5, 24, device=device)
    b = torch.randn(5, 24, device=device)
    if kind == "layer":
        torch.testing.assert_close(
            fused_ops.layer_norm(x, (5, 24), w, b), F.layer_norm(x, (5, 24), w, b)
        )
        torch.testing.assert_close(fused_ops.layer_norm(x, 24), F.layer_norm(x, (24,)))
    else:
        torch.testing.assert_close(fused_ops.rms_norm(x, (5, 24), w), F.rms_norm(x, (5, 24), w))
        torch.testing.assert_close(
            fused_ops.rms_norm(x, [24], None, 1e-3), F.rms_norm(x, [24], None, 1e-3)
        )


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    for shape, ns in [((0, 8), [8]), ((3, 0), [0]), ((2, 0, 4), [4])]:
        x = torch.randn(shape, device=device)
        w = torch.randn(ns, device=device)
        y, mean, rstd = ops.layer_norm(x, ns, w, w, 1e-5)
        assert y.shape == x.shape and mean.shape == x.shape[:-1]
        dx, dw, db = ops.layer_norm_backward(x, x, ns, mean, rstd, w, w, [True, True])
        assert dx.shape == x.shape and dw.shape == tuple(ns)
        assert (dw == 0).all() and (db == 0).all()  # sums over no rows
        y, s, r = ops.add_rms_norm(x, x, ns, w, None, True)
        assert y.shape == x.shape and s.dtype == torch.float32


# ---- autograd machinery -------------------------------------------------------------------


def test_gradcheck_float64():
    def t(*s, **kw):
        return torch.randn(*s, dtype=torch.float64, **kw).requires_grad_()

    x, r = t(3, 4, 5), t(3, 4, 5)
    w, b = t(4, 5), t(4, 5)
    gc = torch.autograd.gradcheck
    assert gc(lambda x, w, b: fused_ops.layer_norm(x, (4, 5), w, b), (x, w, b))
    assert gc(lambda x: fused_ops.layer_norm(x, (5,)), (x,))
    assert gc(lambda x, w: fused_ops.rms_norm(x, (4, 5), w), (x, w))
    assert gc(lambda x: fused_ops.rms_norm(x, (5,), None, 1e-6), (x,))
    assert gc(lambda x, r, w, b: fused_ops.add_layer_norm(x, r, (4, 5), w, b), (x, r, w, b))
    assert gc(lambda x, r, w: fused_ops.add_rms_norm(x, r, (5,), w[0]), (x, r, w))


def _opcheck_cases(device):
    x = torch.randn(6, 4, 10, device=device, requires_grad=True)
    r = torch.randn(6, 4, 10, device=device, requires_grad=True)
    w = torch.randn(10, device=device, requires_grad=True)
    b = torch.randn(10, device=device, requires_grad=True)
    ns = [10]
    y, mean, rstd = ops.layer_norm(x.detach(), ns, w.detach(), b.detach(), 1e-5)
    _, rrstd = ops.rms_norm(x.detach(), ns, w.detach(), None)
    _, s, smean, srstd = ops.add_layer_norm(
        x.detach(), r.detach(), ns, w.detach(), b.detach(), 1e-5, True
    )
    _, s2, s2rstd = ops.add_rms_norm(x.detach(), r.detach(), ns, w.detach(), None, False)
    dy = torch.randn_like(y)
    d = lambda t: t.detach()  # noqa: E731
    return [
        (ops.layer_norm.default, (x, ns, w, b, 1e-5)),
        (ops.layer_norm.default, (x, ns, None, None, 1e-3)),
        (ops.rms_norm.default, (x, ns, w, None)),
        (ops.add_layer_norm.default, (x, r, ns, w, b, 1e-5, True)),
        (ops.add_rms_norm.default, (x, r, ns, w, 1e-6, False)),
        (ops.layer_norm_backward.default, (dy, d(x), ns, mean, rstd, d(w), d(b), [True, True])),
        (ops.layer_norm_backward.default, (dy, d(x), ns, mean, rstd, None, None, [False, False])),
        (ops.rms_norm_backward.default, (dy, d(x), ns, rrstd, d(w), True)),
        (
            ops.add_layer_norm_backward.default,
            (dy, torch.randn_like(s), s, ns, smean, srstd, d(w), d(b), [True, True]),
        ),
        (ops.add_rms_norm_backward.default, (dy, None, s2, ns, s2rstd, d(w), True)),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for op, args in _opcheck_cases(device):
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch._dynamo.reset()
    x = torch.randn(8, 64, device=device, requires_grad=True)
    r = torch.randn(8, 64, device=device, requires_grad=True)
    w = torch.randn(64, device=device, requires_grad=True)
    b = torch.randn(64, device=device, requires_grad=True)

    def f(x, r, w, b):
        h = fused_ops.layer_norm(x, (64,), w, b)
        return fused_ops.add_rms_norm(h, r, (64,), w)

    y, s = torch.compile(f, fullgraph=True)(x, r, w, b)
    out = (y * s).sum()  # outside the compiled graph: keeps inductor's codegen small
    out.backward()
    grads = [t.grad.clone() for t in (x, r, w, b)]
    args64 = [t.detach().double().requires_grad_() for t in (x, r, w, b)]
    h = reference.layer_norm(args64[0], (64,), args64[2], args64[3])
    s = h + args64[1]
    ref = (reference.rms_norm(s, (64,), args64[2], torch.finfo(torch.float32).eps) * s).sum()
    ref.backward()
    assert_close(out, ref, dtype=torch.float32, rtol=1e-5, atol=1e-3)
    for g, a in zip(grads, args64):
        torch.testing.assert_close(g.double().cpu(), a.grad.cpu(), rtol=1e-4, atol=1e-4)


def test_nn_modules_are_drop_in():
    for ours, theirs, kw in [
        (fused_ops.nn.LayerNorm, torch.nn.LayerNorm, {}),
        (fused_ops.nn.LayerNorm, torch.nn.LayerNorm, {"bias": False}),
        (fused_ops.nn.LayerNorm, torch.nn.LayerNorm, {"elementwise_affine": False}),
        (fused_ops.nn.RMSNorm, torch.nn.RMSNorm, {}),
        (fused_ops.nn.RMSNorm, torch.nn.RMSNorm, {"eps": 1e-6}),
    ]:
        ref = theirs((3, 16), **kw)
        for p in ref.parameters():
            p.data.normal_()
        m = ours((3, 16), **kw)
        assert isinstance(m, theirs)
        m.load_state_dict(ref.state_dict())
        assert repr(m) == repr(ref)
        x = torch.randn(2, 3, 16)
        torch.testing.assert_close(m(x), ref(x))
    assert isinstance(fused_ops.nn.LayerNorm(16), torch.nn.LayerNorm)


# ---- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    x = torch.randn(4, 8, device=device)
    w = torch.randn(8, device=device)
    with pytest.raises(RuntimeError, match=r"expected x to end with normalized_shape=\[6\]"):
        fused_ops.layer_norm(x, (6,), w)
    with pytest.raises(RuntimeError, match=r"normalized_shape=\[2, 4, 8\].*shape \[4, 8\]"):
        fused_ops.rms_norm(x, (2, 4, 8))
    with pytest.raises(RuntimeError, match="normalized_shape to have at least one dimension"):
        ops.layer_norm(x, [], None, None, 1e-5)
    with pytest.raises(RuntimeError, match=r"expected weight of shape \[8\].*got \[4\]"):
        fused_ops.layer_norm(x, (8,), torch.randn(4, device=device))
    with pytest.raises(RuntimeError, match=r"expected bias of shape \[8\].*got \[1, 8\]"):
        fused_ops.layer_norm(x, (8,), w, torch.randn(1, 8, device=device))
    with pytest.raises(RuntimeError, match="expected x to be float32.*got Long"):
        fused_ops.layer_norm(torch.ones(2, 8, dtype=torch.long, device=device), (8,))
    with pytest.raises(
        RuntimeError,
        match=r"expected weight to have x's dtype \(BFloat16\) or "
        r"float32, but got Half",
    ):
        fused_ops.rms_norm(x.bfloat16(), (8,), w.half())
    with pytest.raises(RuntimeError, match="expected weight and bias to have the same dtype"):
        fused_ops.layer_norm(x.half(), (8,), w.half(), w)
    with pytest.raises(RuntimeError, match="expected residual and x to have the same shape"):
        fused_ops.add_layer_norm(x, torch.randn(4, 9, device=device), (8,))
    with pytest.raises(
        RuntimeError,
        match=r"expected residual to have x's dtype \(Float\) or "
        r"float32, but got Half",
    ):
        fused_ops.add_rms_norm(x, x.half(), (8,))
    y, mean, rstd = ops.layer_norm(x, [8], w, None, 1e-5)
    with pytest.raises(RuntimeError, match="expected rstd to hold one value per row"):
        ops.layer_norm_backward(x, x, [8], mean, rstd[:2], w, None, [True, False])
    with pytest.raises(RuntimeError, match="expected mean to be Float, but got Half"):
        ops.layer_norm_backward(x, x, [8], mean.half(), rstd, w, None, [True, False])
    with pytest.raises(RuntimeError, match="expected grad_out and x to have the same dtype"):
        ops.rms_norm_backward(x.half(), x, [8], rstd, w, True)
    with pytest.raises(RuntimeError, match="expected grad_out and x to have the same shape"):
        ops.rms_norm_backward(x[:2], x, [8], rstd, w, True)
    with pytest.raises(RuntimeError, match="expected sum to have grad_out's dtype"):
        ops.add_rms_norm_backward(x.half(), None, x.bfloat16(), [8], rstd, None, False)


@CUDA
def test_cuda_device_mismatch():
    x = torch.randn(4, 8, device="cuda")
    with pytest.raises(RuntimeError, match="expected weight and x on the same device"):
        fused_ops.layer_norm(x, (8,), torch.randn(8))
    with pytest.raises(RuntimeError, match="expected bias and x on the same device"):
        fused_ops.layer_norm(x, (8,), None, torch.randn(8))
    with pytest.raises(RuntimeError, match="expected residual and x on the same device"):
        fused_ops.add_layer_norm(x, torch.randn(4, 8), (8,))
    _, rstd = ops.rms_norm(x, [8], None, None)
    with pytest.raises(RuntimeError, match="expected rstd and x on the same device"):
        ops.rms_norm_backward(x, x, [8], rstd.cpu(), None, False)
    with pytest.raises(RuntimeError, match="float64"):
        fused_ops.layer_norm(x.double(), (8,))


# ---- GPU: every kernel strategy, both sides of each threshold ------------------------------
# Forward (bf16/fp16 vectors of 8, fp32 vectors of 4; the span variant, or the scalar
# path, when cols is not a multiple or a pointer is misaligned: test_cuda_span_forward): 16-bit rows of FIXED_COLS with parameters in x's
# dtype take the fixed-length kernel (the "same" weight config below; tested on its own
# further down); otherwise 4 vectors per thread (2 for a float32 residual stream with
# 16-bit x, 8 elements on the scalar path), sub-warp groups up to 32 threads (1024 / 512 /
# 256 columns), whole warps up to 1024 threads (32768 / 16384 / 16384 columns; the scalar
# path: 8192), then the long-row kernel; plain norms that would take more than 512 threads
# there (16-bit rows over 16384, float32 over 8192) take 8 vectors per thread instead, in
# blocks of up to 1024 threads (16-bit 65536, float32 32768: the dispatch test below).
# Backward: prefetching register kernel, 16 elements per thread for 16-bit rows (up to 8192
# columns), 8 for float32 x or a float32 residual stream (up to 4096; then 16 elements
# without prefetch up to 8192), row groups under 128 threads sharing a block (16-bit rows
# under 2048 columns); then on sm_90 a cluster of 2-16 blocks per row
# (8 elements per thread) up to 65536 columns (256-thread blocks up to 16384, 512 beyond;
# many rows per cluster: the test after this one), beyond that (and before sm_90) row sums
# + tiles.
GPU_COLS = [
    1,
    7,
    8,
    64,
    100,
    128,
    129,
    256,
    257,
    511,
    512,
    513,
    520,
    1000,
    1024,
    1032,
    2048,
    2056,
    4096,
    4104,
    5120,
    6152,
    8192,
    8200,
    12288,
    16384,
    16392,
    32768,
    32776,
    50257,
    65536,
    65544,
    131072,
]


def _gpu_rows(cols):
    return max(2, min(300, (1 << 21) // max(cols, 1)))  # a few hundred rows at most, ~2M elems


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cols", GPU_COLS)
def test_cuda_strategies(dtype, kind, cols):
    rows = _gpu_rows(cols)
    x = (torch.randn(rows, cols, device="cuda") + 0.5).to(dtype)
    for wcfg in ["same", "fp32"]:
        w, b = _params(kind, (cols,), dtype, "cuda", wcfg)
        check_forward(kind, x, [cols], w, b, msg=f"cols={cols} weight={wcfg}")
        check_backward(kind, x, [cols], w, b, msg=f"cols={cols} weight={wcfg}")
    # x one element off an aligned allocation: the span path forward, the scalar backward.
    xo = offset_copy(x)
    w, b = _params(kind, (cols,), dtype, "cuda", "same")
    check_forward(kind, xo, [cols], w, b, msg=f"cols={cols} misaligned")
    check_backward(kind, xo, [cols], w, b, msg=f"cols={cols} misaligned")


# Rows off the 16-byte grid (odd widths; views at an odd offset, x, residual and the
# parameters each their own): the forward reads each row as the 16-byte vectors of its
# aligned span (norm_fwd_regs' SPAN variant), y and the sum allocated at x's offset; rows
# the span variant cannot hold (float32 50257) take the scalar path. Few rows, so that every
# head (a row's offset in its 16-byte chunk) comes up; outputs poisoned (a block the size of
# the outputs' padded allocation too).
SPAN_COLS = [4095, 4097, 5121, 32001, 50257]


def _offset_view(t, offset):
    """t's values in a fresh buffer, `offset` elements past its (aligned) start."""
    buf = torch.empty(t.numel() + offset, device=t.device, dtype=t.dtype)
    return buf[offset:].view(t.shape).copy_(t)


def _span_inputs(dtype, op, cols, offset):
    """(kind, add, x, residual, weight, bias, eps) for the span tests: x and the residual
    `offset` elements past an aligned start, the parameters (when offset) at offsets of their
    own."""
    kind = op.removeprefix("add_")
    rows = 11 if cols < 32000 else 5
    x = _offset_view((torch.randn(rows, cols, device="cuda") * 2 + 0.5).to(dtype), offset)
    r = _offset_view(torch.randn(rows, cols, device="cuda").to(dtype), offset)
    w, b = _params(kind, (cols,), dtype, "cuda", "same")
    if offset:
        w = _offset_view(w, offset + 2)
        b = None if b is None else _offset_view(b, offset + 1)
    return kind, op.startswith("add_"), x, r, w, b, _eps(kind, dtype)


def _span_expected(cols, dtype):
    vw = 16 // dtype.itemsize
    return -(-((cols + 2 * vw - 2) // vw) // 8) <= 1024


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("op", ["layer", "rms", "add_layer", "add_rms"])
@pytest.mark.parametrize("cols", SPAN_COLS)
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_cuda_span_forward(dtype, op, cols, offset):
    kind, add, x, r, w, b, eps = _span_inputs(dtype, op, cols, offset)

    def run():
        if not add:
            return fused_forward(kind, x, [cols], w, b, eps)
        if kind == "layer":
            return ops.add_layer_norm(x, r, [cols], w, b, eps, False)
        return ops.add_rms_norm(x, r, [cols], w, eps, False)

    names = [a for n in cuda_kernel_names(run) if (a := _fwd_regs(n)) is not None]
    vw = 16 // dtype.itemsize
    if _span_expected(cols, dtype):
        assert names and all(a["SPAN"] == 1 and a["VEC"] == vw for a in names), names
        assert all(a["RES"] == (2 if a["VPT"] == 8 and add else int(add)) for a in names), names
    else:
        assert all(a["SPAN"] == 0 and a["VEC"] == 1 for a in names), names
    msg = f"op={op} cols={cols} offset={offset}"
    poison_next_alloc((x.numel() + 16) * x.element_size(), x.device)
    if not add:
        y, _, _ = check_forward(kind, x, [cols], w, b, eps, msg=msg)
        if offset:  # y at x's offset in its 16-byte chunk (the span path's outputs)
            assert y.data_ptr() % 16 == x.data_ptr() % 16
    else:
        poison_next_alloc((x.numel() + 16) * x.element_size(), x.device)
        check_add(kind, x, r, [cols], w, b, False, eps, msg=msg)


def _bwd_regs_span(name):
    """(VEC, SPAN) of a norm_bwd_regs kernel name, or None for another kernel."""
    args = kernel_template_args(name, "norm_bwd_regs")
    return None if args is None else (int(args[3]), args[7] == "true")


def _span_bwd_expected(cols, dtype):
    vw = 16 // dtype.itemsize
    return -(-((cols + 2 * vw - 2) // vw) // (32 // (vw * dtype.itemsize))) <= 512


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("op", ["layer", "rms", "add_layer", "add_rms"])
@pytest.mark.parametrize("cols", SPAN_COLS)
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_cuda_span_backward(dtype, op, cols, offset):
    # The backward of the same rows: norm_bwd_regs' span variant where its prefetching form
    # holds the span (16-bit rows up to ~8K columns, float32 up to ~4K), dy and d_sum copied
    # to x's offset where they sit elsewhere, dx allocated there; else the scalar path.
    kind, add, x, r, w, b, eps = _span_inputs(dtype, op, cols, offset)
    xa = x.detach().requires_grad_()  # a leaf at x's offset
    wa = w.detach().requires_grad_()
    ba = None if b is None else b.detach().requires_grad_()
    if add:
        ra = r.detach().requires_grad_()
        if kind == "layer":
            outs = fused_ops.add_layer_norm(xa, ra, [cols], wa, ba, eps, False)
        else:
            outs = fused_ops.add_rms_norm(xa, ra, [cols], wa, eps, False)
    elif kind == "layer":
        outs = (fused_ops.layer_norm(xa, [cols], wa, ba, eps),)
    else:
        outs = (fused_ops.rms_norm(xa, [cols], wa, eps),)
    grads = [torch.randn_like(o) for o in outs]
    names = cuda_kernel_names(lambda: torch.autograd.backward(outs, grads))
    got = [a for n in names if (a := _bwd_regs_span(n)) is not None]
    vw = 16 // dtype.itemsize
    if _span_bwd_expected(cols, dtype):
        assert got and all(a == (vw, True) for a in got), names
    else:
        assert all(not a[1] for a in got), names
    msg = f"op={op} cols={cols} offset={offset}"
    poison_next_alloc((x.numel() + 16) * x.element_size(), x.device)
    if add:
        check_add(kind, x, r, [cols], w, b, False, eps, msg=msg)
    else:
        check_backward(kind, x, [cols], w, b, eps, msg=msg)


@CUDA
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cols", [1, 3, 7, 9, 15, 17, 100, 1001])
def test_cuda_span_forward_short_rows(kind, cols):
    # Rows shorter than a vector or a few: spans of one or two vectors, both edges in one,
    # several rows a row group (forward and backward; the backward's groups combine their
    # dweight / dbias, each at its own head); float32 parameters and residual_in_fp32 (no
    # span for the sum in float32: the scalar path) too.
    for dtype in (torch.bfloat16, torch.float32):
        x = _offset_view((torch.randn(37, cols, device="cuda") + 0.5).to(dtype), 3)
        r = _offset_view(torch.randn(37, cols, device="cuda").to(dtype), 3)
        for wcfg in ["same", "fp32"]:
            w, b = _params(kind, (cols,), dtype, "cuda", wcfg)
            names = [
                a
                for n in cuda_kernel_names(
                    lambda: fused_forward(kind, x, [cols], w, b, _eps(kind, dtype))
                )
                if (a := _fwd_regs(n)) is not None
            ]
            assert names and all(a["SPAN"] == 1 for a in names), names
            poison_next_alloc((x.numel() + 16) * x.element_size(), x.device)
            check_forward(kind, x, [cols], w, b, msg=f"cols={cols} weight={wcfg}")
            poison_next_alloc((x.numel() + 16) * x.element_size(), x.device)
            check_backward(kind, x, [cols], w, b, msg=f"cols={cols} weight={wcfg}")
            for fp32 in [False, True]:
                poison_next_alloc((x.numel() + 16) * x.element_size(), x.device)
                check_add(kind, x, r, [cols], w, b, fp32, msg=f"cols={cols} fp32={fp32}")


# The cluster backward (rows of 8K-64K columns on sm_90) walks many rows per cluster, the
# blocks' row sums exchanged through mbarrier phases that cycle every 4 rows: enough rows
# for 12-25 per cluster on an H100 / H200 (~50 / 33 / 16 clusters at these lengths; a slip
# in the phase or buffer rotation shows up after the first 4), rows of different spread
# and offset, the 16-byte and scalar paths, float32 params, and the add forms (d_sum added
# to dx) with a float32 residual stream.
@CUDA
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cols", [12288, 16392, 32768])
def test_cuda_cluster_backward_many_rows(kind, cols):
    rows = 600 if cols < 32768 else 400
    spread = torch.rand(rows, 1, device="cuda") * 4 + 0.1
    x = torch.randn(rows, cols, device="cuda") * spread + torch.randn(rows, 1, device="cuda")
    x = x.to(torch.bfloat16)
    for wcfg in ["same", "fp32"]:
        w, b = _params(kind, (cols,), x.dtype, "cuda", wcfg)
        check_backward(kind, x, [cols], w, b, msg=f"cols={cols} rows={rows} weight={wcfg}")
    xo = offset_copy(x)
    w, b = _params(kind, (cols,), x.dtype, "cuda", "same")
    check_backward(kind, xo, [cols], w, b, msg=f"cols={cols} rows={rows} misaligned")
    r = torch.randn(rows, cols, device="cuda").to(x.dtype)
    for fp32 in [False, True]:
        check_add(kind, x, r, [cols], w, b, fp32, msg=f"cols={cols} rows={rows} fp32={fp32}")


def _far_row(cols, dtype):
    """A row far from zero (E[x^2] - E[x]^2 would lose its variance): mean 1e4, spread 300;
    float32 rows at 1e3, since at 1e4 the float32 rounding of the mean is ~2e-6 of xhat, past
    float32's tolerance for any float32 kernel (test_large_mean_rows holds float32 at 1e4 to
    its own bound)."""
    return (1e3 if dtype == torch.float32 else 1e4) + 300 * torch.randn(cols, device="cuda")


# The compile-time-shaped forward (norm_fwd_fixed): 16-bit rows of 32 x TPR columns for the
# TPRs of FixedTprs (csrc/cuda/norm.cu), parameters in x's dtype; norm.fixed=0 sends
# the same rows to norm_fwd_regs. Rows: a count that is not a multiple of 4 (a partly empty
# last block for the runtime-shaped kernels; norm_fwd_fixed runs a block a row); rows of one
# random (non-dyadic) value each, which must normalize to exactly 0 (layer norm: y == b); a
# row at mean 1e4 (float32: 1e3).
FIXED_COLS = [1024, 2048, 3072, 4096, 5120, 6144, 8192, 12288, 16384]
# 32768: norm_fwd_regs shaped at compile time (the wide variant for the plain norms, 1024
# threads for the add forms).
FIXED_COLS_ALL = FIXED_COLS + [32768]


def _fixed_params(kind, cols, dtype, weight, bias):
    w = (1 + 0.5 * torch.randn(cols, device="cuda")).to(dtype) if weight else None
    b = (0.5 * torch.randn(cols, device="cuda")).to(dtype) if bias and kind == "layer" else None
    return w, b


# norm_fwd_regs' wide variant shaped at compile time, one row per block of 384, 512 or 1024
# threads (8 vectors each) for plain rows with parameters in x's dtype: float32 rows of
# 12288, 16384, 32768 and 16-bit rows of 24576 and 65536 (and 32768, above); and float32
# layer_norm rows of 8192 (256 threads).
FIXED_WIDE = [
    (8192, torch.float32),
    (12288, torch.float32),
    (16384, torch.float32),
    (32768, torch.float32),
    (24576, torch.bfloat16),
    (65536, torch.float16),
]
FIXED_LENGTH_CASES = [
    (c, d) for c in FIXED_COLS_ALL for d in (torch.bfloat16, torch.float16)
] + FIXED_WIDE


@CUDA
@pytest.mark.parametrize("fixed", ["1", "0"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cols,dtype", FIXED_LENGTH_CASES)
def test_cuda_fixed_lengths(cols, dtype, kind, fixed, knobs):
    knobs(f"norm.fixed={fixed}")
    rows = (1 << 20) // cols + 1  # 1025 rows of 1024, ..., 65 of 16384, 33 of 32768
    x = torch.randn(rows, cols, device="cuda")
    const = [3, rows - 1]  # the last row: the last block
    x[const] = torch.randn(len(const), 1, device="cuda") * 3
    x[5] = _far_row(cols, dtype)
    x = x.to(dtype)
    configs = [(True, True), (False, False)]
    if kind == "layer":
        configs += [(True, False), (False, True)]
    for weight, bias in configs:
        w, b = _fixed_params(kind, cols, dtype, weight, bias)
        msg = f"cols={cols} weight={weight} bias={bias} norm.fixed={fixed}"
        check_forward(kind, x, [cols], w, b, msg=msg)
        y, _, rstd = fused_forward(kind, x, [cols], w, b, _eps(kind, dtype))
        if kind == "layer":
            want = b if b is not None else torch.zeros(cols, device="cuda", dtype=dtype)
            for r in const:
                assert torch.equal(y[r], want), f"{msg}: constant row {r} not exactly b"
    r = torch.randn(rows, cols, device="cuda").to(dtype)
    w, b = _fixed_params(kind, cols, dtype, True, True)
    check_add(kind, x, r, [cols], w, b, False, msg=f"cols={cols} add norm.fixed={fixed}")


# The forward's wide variant (norm_fwd_regs at 8 vectors per thread) for plain norms whose
# rows need more than 512 threads at 4 (float32 over 8192 columns, 16-bit over 16384 where
# no fixed kernel takes them), up to 1024 threads; past that norm_fwd_long (two reads).
# Parameters in float32, so no 16-bit fixed kernel intervenes (float32 rows of 12288 /
# 16384 / 32768 take the wide variant at a compile-time shape, still 8 vectors a thread).
# float32 layer_norm rows of 8192 take the wide variant too, rms_norm's 512 threads
# at 4 vectors. (dtype, columns, kernel): "wide" (8 vectors a thread), "regs" (the default
# 4), "long"; or the kernel per norm.
WIDE_CASES = [
    (torch.float32, 8200, "wide"),
    (torch.float32, 12288, "wide"),
    (torch.float32, 32768, "wide"),
    (torch.float32, 32776, "long"),
    (torch.bfloat16, 65536, "wide"),
    (torch.bfloat16, 65544, "long"),
    (torch.float32, 8192, {"layer": "wide", "rms": "regs"}),
]


@CUDA
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype,cols,want", WIDE_CASES)
def test_cuda_wide_forward_dispatch(kind, dtype, cols, want):
    want = want[kind] if isinstance(want, dict) else want
    x = torch.randn(4, cols, device="cuda", dtype=dtype)
    w = torch.randn(cols, device="cuda", dtype=torch.float32)
    names = [
        n
        for n in cuda_kernel_names(lambda: fused_forward(kind, x, [cols], w, None, 1e-5))
        if "norm_fwd" in n
    ]
    vpt = [a["VPT"] for a in map(_fwd_regs, names) if a]
    got = (
        "long"
        if any("norm_fwd_long" in n for n in names) and not vpt
        else {(8,): "wide", (4,): "regs"}.get(tuple(vpt), f"? {names}")
    )
    assert got == want, names


# The add forms' rows past 4 vectors a thread (float32 16K-32K, 16-bit sums in x's dtype
# 32K-64K): the wide variant with the residual staged in shared memory (norm_fwd_regs with
# RES = 2), compile-time shaped at 32768 float32 / 65536 16-bit with parameters in x's
# dtype; longer rows, and a float32 residual stream with 16-bit x (no wide variant), take
# norm_fwd_long. (x dtype, columns, residual_in_fp32, kernel.) Rows of different spreads,
# a row whose sum is constant (variance 0: layer norm gives exactly b on the staged kernel,
# whose mean is the row's first sum element plus an exact 0), a row far from zero;
# parameters in x's dtype, in float32, and none. (float32 16384: the last length that
# takes neither, 4 vectors a thread.)
ADD_WIDE_CASES = [
    (torch.float32, 32768, False, "staged"),
    (torch.float32, 20004, False, "staged"),
    (torch.float32, 16388, False, "staged"),
    (torch.float32, 16384, False, "other"),
    (torch.float32, 32776, False, "long"),
    (torch.bfloat16, 65536, False, "staged"),
    (torch.float16, 40008, False, "staged"),
    (torch.bfloat16, 65544, False, "long"),
    (torch.bfloat16, 40008, True, "long"),
]


@CUDA
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype,cols,res32,want", ADD_WIDE_CASES)
def test_cuda_add_wide_forward(kind, dtype, cols, res32, want):
    rows = 6
    spread = torch.rand(rows, 1, device="cuda") * 4 + 0.1
    x = (torch.randn(rows, cols, device="cuda") * spread).to(dtype)
    r = torch.randn(rows, cols, device="cuda") + torch.randn(rows, 1, device="cuda")
    x[2] = torch.randn(1, device="cuda") * 3  # x + r constant: variance 0
    r[2] = torch.randn(1, device="cuda") * 3
    r[4] = _far_row(cols, dtype)
    r = r.to(torch.float32 if res32 else dtype)
    for wdtype in ("same", "fp32", None):
        w, b = _params(kind, (cols,), dtype, "cuda", wdtype)
        check_add(kind, x, r, [cols], w, b, res32, msg=f"cols={cols} params={wdtype}")
        if want == "staged" and kind == "layer":
            y, _ = fused_ops.add_layer_norm(x, r, [cols], w, b, 1e-5, res32)
            want_row = (
                b.to(dtype) if b is not None else torch.zeros(cols, device="cuda", dtype=dtype)
            )
            assert torch.equal(y[2], want_row), f"cols={cols} params={wdtype}: constant row"
        call = (
            (lambda: ops.add_layer_norm(x, r, [cols], w, b, 1e-5, res32))
            if kind == "layer"
            else (lambda: ops.add_rms_norm(x, r, [cols], w, 1e-5, res32))
        )
        names = [n for n in cuda_kernel_names(call) if "norm_fwd" in n]
        # norm_fwd_regs at VPT = 8, RES = 2, no dropout stage (DROP = 0)
        staged = [
            a["FIXED_TPR"]
            for a in map(_fwd_regs, names)
            if a and a["VPT"] == 8 and a["RES"] == 2 and a["DROP"] == 0
        ]
        got = (
            "staged"
            if staged
            else ("long" if any("norm_fwd_long" in n for n in names) else "other")
        )
        assert got == want, (wdtype, names)
        if want == "staged":  # compile-time shaped: whole vectors, parameters in x's dtype
            whole = (w is None or w.dtype == dtype) and cols in (32768, 65536)
            assert staged == ([1024] if whole else [0]), (wdtype, names)


# The compile-time-shaped cluster backward (norm_bwd_fixed, sm_90): 16-bit rows of 4096-32768
# columns and float32 rows of 12288 / 16384, parameters (and the add forms' sum) in x's
# dtype. Rows enough for 6 or more per cluster (the exchange slots cycle every 4 rows, the
# staging slots every 3), of different spreads and offsets, a row far from zero, every
# weight / bias combination (no weight: w = 1 in the kernel; no bias: no dbias partials).
# norm.fixed=0 sends such rows to norm_bwd_regs (4096-8192) or norm_bwd_cluster, which
# test_cuda_cluster_backward_many_rows runs at 12288-32768 through its float32-parameter and
# float32-residual cases.
FIXED_BWD_CASES = [
    (d, c) for d in (torch.bfloat16, torch.float16) for c in (4096, 5120, 8192, 12288, 16384, 32768)
] + [(torch.float32, 12288), (torch.float32, 16384)]
# Clusters resident on an H100 / H200 are ~330 / 264 / 198 at 4096 / 5120 / 8192 columns
# (16-bit), ~50 past that.
FIXED_BWD_ROWS = {4096: 2000, 5120: 1600, 8192: 1200, 32768: 300}


@CUDA
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype,cols", FIXED_BWD_CASES)
def test_cuda_fixed_backward(cols, kind, dtype):
    rows = FIXED_BWD_ROWS.get(cols, 600)
    spread = torch.rand(rows, 1, device="cuda") * 4 + 0.1
    x = torch.randn(rows, cols, device="cuda") * spread + torch.randn(rows, 1, device="cuda")
    x[7] = _far_row(cols, dtype)
    x = x.to(dtype)
    configs = [(True, True), (False, False)]
    if kind == "layer" and dtype == torch.bfloat16:
        configs += [(True, False), (False, True)]
    for weight, bias in configs:
        w, b = _fixed_params(kind, cols, dtype, weight, bias)
        check_backward(kind, x, [cols], w, b, msg=f"cols={cols} weight={weight} bias={bias}")
    # The add form: d_sum added to dx (a residual stream in x's dtype; a float32 one with
    # 16-bit x takes norm_bwd_cluster).
    r = torch.randn(rows, cols, device="cuda").to(dtype)
    w, b = _fixed_params(kind, cols, dtype, True, True)
    check_add(kind, x, r, [cols], w, b, False, msg=f"cols={cols} add")


# Which forward kernel the compile-time-shaped lengths reach (a dispatch slip would fall
# back to the run-time kernels silently: every result would still be right): per (columns,
# dtype, add form), a predicate on the kernel names. Only with parameters in x's dtype and
# norm.fixed unset (16-bit x: not with float32 parameters either).
def _wide_at(tpr):
    return lambda n: (a := _fwd_regs(n)) is not None and a["FIXED_TPR"] == tpr and a["DROP"] == 0


FWD_FIXED_KERNELS = [
    (4096, torch.bfloat16, False, lambda n: "norm_fwd_fixed" in n),
    (4096, torch.bfloat16, True, lambda n: "norm_fwd_fixed" in n),
    (32768, torch.bfloat16, False, _wide_at(512)),  # the wide variant
    (32768, torch.bfloat16, True, _wide_at(1024)),  # the add forms
    (24576, torch.bfloat16, False, _wide_at(384)),
    (65536, torch.float16, False, _wide_at(1024)),
    (12288, torch.float32, False, _wide_at(384)),
    (16384, torch.float32, False, _wide_at(512)),
    (32768, torch.float32, False, _wide_at(1024)),
    (8192, torch.float32, False, _wide_at(256)),  # layer norm only
]


@CUDA
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "cols,dtype,add,is_fixed",
    FWD_FIXED_KERNELS,
    ids=[f"{c}-{str(d)[6:]}-{'add' if a else 'plain'}" for c, d, a, _ in FWD_FIXED_KERNELS],
)
def test_cuda_fixed_forward_dispatch(kind, cols, dtype, add, is_fixed, knobs):
    x = torch.randn(8, cols, device="cuda", dtype=dtype)
    r = torch.randn_like(x)
    runs = [
        (dtype, "1", kind == "layer" or cols != 8192 or dtype != torch.float32),
        (dtype, "0", False),
    ]
    if dtype != torch.float32:
        runs.append((torch.float32, "1", False))
    for w_dtype, fixed, want in runs:
        knobs(f"norm.fixed={fixed}")
        w = torch.randn(cols, device="cuda", dtype=w_dtype)
        if not add:
            call = lambda: fused_forward(kind, x, [cols], w, None, 1e-5)  # noqa: E731
        elif kind == "layer":
            call = lambda: ops.add_layer_norm(x, r, [cols], w, None, 1e-5, False)  # noqa: E731
        else:
            call = lambda: ops.add_rms_norm(x, r, [cols], w, 1e-5, False)  # noqa: E731
        names = [n for n in cuda_kernel_names(call) if "norm_fwd" in n]
        assert names, (w_dtype, fixed)
        assert any(is_fixed(n) for n in names) == want, (w_dtype, fixed, names)


def _clusters_run():
    """Whether the cluster backwards run here (sm_90 code on an sm_90 GPU): the 16384-column
    rms backward with the fixed kernels off takes norm_bwd_cluster, else the two-pass path."""
    x = torch.randn(64, 16384, device="cuda", dtype=torch.bfloat16)
    _, _, rstd = fused_forward("rms", x, [16384], None, None, 1e-5)
    with overrides("norm.fixed=0"):
        names = cuda_kernel_names(
            lambda: ops.add_rms_norm_backward(
                torch.randn_like(x), None, x, [16384], rstd, None, False
            )
        )
    return any("norm_bwd_cluster" in n for n in names)


def _add_backward(kind, dy, ds, x, cols, mean, rstd, w):
    """The add form's backward op (d_sum ds, or None) as a call, for dispatch tests."""
    if kind == "layer":
        return lambda: ops.add_layer_norm_backward(
            dy, ds, x, [cols], mean, rstd, w, None, [True, False]
        )
    return lambda: ops.add_rms_norm_backward(dy, ds, x, [cols], rstd, w, True)


@CUDA
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_fixed_backward_dispatch(kind, knobs):
    # 16384 columns reach norm_bwd_fixed only with parameters in x's dtype and
    # norm.fixed unset (with or without the add forms' d_sum); float32 parameters
    # and norm.fixed=0 take norm_bwd_cluster. Where clusters run only (sm_90 code on
    # an sm_90 GPU): skipped where the rms backward takes the two-pass path instead.
    cols = 16384
    if not _clusters_run():
        pytest.skip("no thread-block clusters here")
    x = torch.randn(64, cols, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    for w_dtype, fixed, dsum, want in [
        (torch.bfloat16, "1", False, True),
        (torch.float32, "1", False, False),
        (torch.bfloat16, "1", True, True),
        (torch.bfloat16, "0", False, False),
    ]:
        knobs(f"norm.fixed={fixed}")
        w = torch.randn(cols, device="cuda", dtype=w_dtype)
        _, mean, rstd = fused_forward(kind, x, [cols], w, None, 1e-5)
        ds = torch.randn_like(x) if dsum else None
        names = cuda_kernel_names(_add_backward(kind, dy, ds, x, cols, mean, rstd, w))
        assert any("norm_bwd_cluster" in n or "norm_bwd_fixed" in n for n in names), names
        assert any("norm_bwd_fixed" in n for n in names) == want, (w_dtype, fixed, dsum, names)


def _backward_rows(rows, cols, dtype):
    """Rows of different spread and offset, a constant row (7) and a row at mean 1e4."""
    spread = torch.rand(rows, 1, device="cuda") * 4 + 0.1
    x = torch.randn(rows, cols, device="cuda") * spread + torch.randn(rows, 1, device="cuda")
    x[7] = 2.5
    x[rows - 2] = _far_row(cols, dtype)
    return x.to(dtype)


def _check_backward_forms(kind, x, dy, mean, rstd, tag):
    """The backward of rows x against float64 in every parameter config (weight and bias,
    neither; for layer norm dweight alone and dbias alone), the masked outputs (the same
    bits as the unmasked ones: a masked term is left out, the sums unchanged) and the add
    forms (d_sum added to dx). mean / rstd: x's forward statistics, dy: a gradient for
    the mask check."""
    rows, cols = x.shape
    dtype = x.dtype
    for wcfg in ["same", None]:
        w, b = _params(kind, (cols,), dtype, "cuda", wcfg)
        check_backward(kind, x, [cols], w, b, msg=f"cols={cols} weight={wcfg} {tag}")
    w, b = _params(kind, (cols,), dtype, "cuda", "same")
    if kind == "layer":
        check_backward(kind, x, [cols], w, None, msg=f"cols={cols} no bias {tag}")
        check_backward(kind, x, [cols], None, b, msg=f"cols={cols} no weight {tag}")
        full = ops.layer_norm_backward(dy, x, [cols], mean, rstd, w, b, [True, True])
        for mask in [[True, False], [False, True]]:
            part = ops.layer_norm_backward(dy, x, [cols], mean, rstd, w, b, mask)
            assert torch.equal(part[0], full[0])
            for k in (1, 2):
                assert torch.equal(part[k], full[k]) if mask[k - 1] else part[k].numel() == 0
    r = torch.randn(rows, cols, device="cuda").to(dtype)
    check_add(kind, x, r, [cols], w, b, False, msg=f"cols={cols} add {tag}")


# norm_bwd_regs' staged variant (float32 rows, x or the add forms' float32 sum: the
# prefetching path with its row tiles, mean / rstd and w in shared memory, each thread's
# copies two rows ahead) against norm.stage=0 (tiles in registers): lengths on the
# 16-byte path from one vector to 4096 (float32, 512 threads) and, for the 16-bit rows, the
# add forms with a float32 residual stream (32-byte vectors staged as two copies); several
# row groups a block (8, 1000), rows enough for many per block so that the three-slot ring
# wraps, rows of different spread and offset, a constant row and a row at mean 1e4, every
# parameter config.
STAGED_CASES = [
    (torch.bfloat16, 8),
    (torch.bfloat16, 1000),
    (torch.bfloat16, 4096),
    (torch.float16, 4096),
    (torch.float32, 8),
    (torch.float32, 1000),
    (torch.float32, 4096),
]


@CUDA
@pytest.mark.parametrize("stage", ["1", "0"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype,cols", STAGED_CASES)
def test_cuda_staged_backward(dtype, cols, kind, stage, knobs):
    knobs(f"norm.stage={stage}")
    rows = max(1621, (1 << 22) // cols)  # >= 5 rows a row group at any grid size here
    x = _backward_rows(rows, cols, dtype)
    fp32_rows = dtype == torch.float32
    if fp32_rows:
        for wcfg in ["same", None]:
            w, b = _params(kind, (cols,), dtype, "cuda", wcfg)
            check_backward(kind, x, [cols], w, b, msg=f"cols={cols} weight={wcfg} stage={stage}")
    w, b = _params(kind, (cols,), dtype, "cuda", "same")
    r = torch.randn(rows, cols, device="cuda").to(dtype)
    for fp32 in [False, True] if fp32_rows else [True]:
        check_add(kind, x, r, [cols], w, b, fp32, msg=f"cols={cols} fp32={fp32} stage={stage}")


@CUDA
@pytest.mark.parametrize(
    "dtype,cols,staged",
    [
        (torch.bfloat16, 1000, False),
        (torch.bfloat16, 4104, False),
        (torch.float32, 1000, True),
        (torch.float32, 4096, True),
    ],
)
def test_cuda_staged_backward_dispatch(dtype, cols, staged, knobs):
    # Float32 rows on the prefetching path are staged, 16-bit ones keep the register tiles
    # (at lengths no fixed backward takes); norm.stage=0 turns staging off.
    # The float32 4096 ring is 124 KB a block: GPUs with less shared memory a block
    # (sm_86 / sm_89: 99 KB) keep the register tiles.
    optin = getattr(torch.cuda.get_device_properties(0), "shared_memory_per_block_optin", None)
    staged = staged and (cols < 4096 or optin is None or optin >= 128 * 1024)
    x = torch.randn(64, cols, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    _, mean, rstd = fused_forward("layer", x, [cols], None, None, 1e-5)
    call = lambda: ops.layer_norm_backward(
        dy,
        x,
        [cols],
        mean,
        rstd,
        None,
        None,  # noqa: E731
        [False, False],
    )
    knobs("norm.bwd_bulk=0")  # 16-bit 1000 columns: norm_bwd_regs
    for env, want in [("1", staged), ("0", False)]:
        knobs(f"norm.stage={env}")
        names = [n for n in cuda_kernel_names(call) if "norm_bwd_regs" in n]
        # STAGES is the template's seventh argument (T, W, R, VEC, VPT, PF, STAGES, SPAN).
        stages = [int(kernel_template_args(n, "norm_bwd_regs")[6]) for n in names]
        assert len(stages) == 1, names
        assert (stages[0] > 0) == want, (env, names)


@CUDA
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "dtype,cols",
    [
        (torch.bfloat16, 4096),
        (torch.bfloat16, 5120),
        (torch.float16, 8192),
        (torch.float32, 12288),
        (torch.float32, 16384),
    ],
)
def test_cuda_fixed_backward_lengths_dispatch(kind, dtype, cols, knobs):
    # The fixed backward's lengths beside 12288-32768 16-bit (test_cuda_fixed_backward_dispatch):
    # 16-bit rows of 4096 / 5120 / 8192 and float32 rows of 12288 / 16384, parameters in x's
    # dtype, with and without the add forms' d_sum, take norm_bwd_fixed where clusters run;
    # norm.fixed=0 sends them to the register (16-bit) or runtime cluster (float32)
    # backward.
    if not _clusters_run():
        pytest.skip("no thread-block clusters here")
    x = torch.randn(64, cols, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    w = torch.randn(cols, device="cuda", dtype=dtype)
    _, mean, rstd = fused_forward(kind, x, [cols], w, None, 1e-5)
    other = "norm_bwd_regs" if dtype != torch.float32 else "norm_bwd_cluster"
    for fixed, dsum in [("1", False), ("1", True), ("0", False)]:
        knobs(f"norm.fixed={fixed}")
        ds = torch.randn_like(x) if dsum else None
        names = cuda_kernel_names(_add_backward(kind, dy, ds, x, cols, mean, rstd, w))
        want = "norm_bwd_fixed" if fixed == "1" else other
        assert any(want in n for n in names), (fixed, dsum, names)
        assert fixed == "1" or not any("norm_bwd_fixed" in n for n in names), names


# norm_bwd_warp (16-bit rows of 256-512 columns, parameters and rows in x's dtype: a warp a
# row, each warp's dweight / dbias terms in its own slice of shared memory, the slices added
# in warp order at the end): its two widths (1 and 2 vectors a lane; 264 / 392 / 504 columns
# leave the last round of vectors partly filled), the prefetching variant forced on and off
# (norm.bwd_pf; by default the plain norms take it, the add forms not) and blocks of 3
# warps (norm.bwd_warps=3: many blocks an SM, many partial rows); rows enough that
# every warp walks several (4-6 at 24 / 16 warps an SM on an H100 / H200; a slip in a
# slice's layout would mix columns or warps), of different spread and offset, a constant row
# and a row at mean 1e4; every parameter config (dweight alone, dbias alone, both, neither)
# and the add forms (d_sum added to dx). Each case first checks which instantiation ran.
WARP_BWD_CASES = [(torch.bfloat16, c) for c in [256, 264, 392, 504, 512]] + [(torch.float16, 512)]
_WARP_KERNEL = re.compile(r"norm_bwd_warp<[^,<>]+, (\d), (true|false), (true|false)>")


def _kernel_instance(call, pattern):
    """The template arguments (pattern's groups) of the one launch of pattern's kernel that
    call() makes, or None."""
    found = [m.groups() for n in cuda_kernel_names(call) for m in [pattern.search(n)] if m]
    assert len(found) <= 1, found
    return found[0] if found else None


def _warp_instance(call):
    """(VPT, DSUM, PF) of the one norm_bwd_warp launch call() makes, or None."""
    g = _kernel_instance(call, _WARP_KERNEL)
    return (int(g[0]), g[1] == "true", g[2] == "true") if g else None


@CUDA
@pytest.mark.parametrize("spec", ["", "norm.bwd_pf=0", "norm.bwd_pf=1", "norm.bwd_warps=3"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype,cols", WARP_BWD_CASES)
def test_cuda_warp_backward(dtype, cols, kind, spec, knobs):
    knobs(spec)
    rows = 4 * 132 * 24 + 37
    x = _backward_rows(rows, cols, dtype)
    w, b = _params(kind, (cols,), dtype, "cuda", "same")
    _, mean, rstd = fused_forward(kind, x, [cols], w, b, 1e-5)
    dy = torch.randn_like(x)
    vpt = 1 if cols // 8 <= 32 else 2
    for dsum in [False, True]:
        pf = spec.endswith("pf=1") or (not dsum and not spec.endswith("pf=0"))
        call = (
            _add_backward(kind, dy, torch.randn_like(x), x, cols, mean, rstd, w)
            if dsum
            else _add_backward(kind, dy, None, x, cols, mean, rstd, w)
        )
        assert _warp_instance(call) == (vpt, dsum, pf), (dsum, spec)
    _check_backward_forms(kind, x, dy, mean, rstd, spec)


@CUDA
@pytest.mark.parametrize(
    "dtype,cols,wdtype,want",
    [
        (torch.bfloat16, 512, "same", True),
        (torch.float16, 256, "same", True),
        (torch.bfloat16, 504, None, True),
        (torch.bfloat16, 248, "same", False),  # under 32 vectors: lanes would idle
        (torch.bfloat16, 520, "same", False),  # over 64 vectors (norm_bwd_bulk's rows)
        (torch.bfloat16, 260, "same", False),  # not whole 16-byte vectors: the scalar path
        (torch.bfloat16, 1024, "same", False),
        (torch.bfloat16, 512, "fp32", False),  # parameters not in x's dtype
        (torch.float32, 512, "same", False),
    ],
)
def test_cuda_warp_backward_dispatch(dtype, cols, wdtype, want, knobs):
    # Which rows take norm_bwd_warp, and norm.bwd_warp=0 sending them elsewhere; the
    # add forms with a float32 residual stream (float32 rows) never take it.
    x = torch.randn(64, cols, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    w, _ = _params("layer", (cols,), dtype, "cuda", wdtype)
    _, mean, rstd = fused_forward("layer", x, [cols], w, None, 1e-5)
    call = lambda: ops.layer_norm_backward(
        dy,
        x,
        [cols],
        mean,
        rstd,
        w,
        None,  # noqa: E731
        [True, w is not None],
    )
    for env, expect in [("1", want), ("0", False)]:
        knobs(f"norm.bwd_warp={env}")
        names = cuda_kernel_names(call)
        assert any("norm_bwd_warp" in n for n in names) == expect, (env, names)
    knobs("norm.bwd_warp=1")
    if want and wdtype is not None:
        x32 = x.float()
        _, _, rstd = fused_forward("rms", x32, [cols], None, None, 1e-5)
        names = cuda_kernel_names(
            lambda: ops.add_rms_norm_backward(dy, dy.float(), x32, [cols], rstd, w, True)
        )
        assert not any("norm_bwd_warp" in n for n in names), names


# norm_bwd_bulk (16-bit rows of 65-128 vectors, parameters and rows in x's dtype, sm_90: a
# row a pair of warps, 2 vectors a thread, each pair with its own ring of one-row slots
# filled by the copy engine; 4 slots by default, 3 forced by norm.bwd_bulk_stages):
# 520 (most of the pair's second vectors past the row: zeros in the slots, no stores), 776,
# 1000 and 1024 columns; rows enough that every pair walks several rows and its ring wraps,
# pairs with one row more than others, rows of different spread and offset, a constant row
# and a row at mean 1e4; every parameter config (dweight alone, dbias alone, both,
# neither), the masked outputs, the add forms (d_sum added to dx); each case first checks
# that the kernel ran in the norm's form (layer_norm's, or rms_norm's without mean and
# dbias), and with norm.bwd_bulk=0 that it did not.
BULK_BWD_CASES = [(torch.bfloat16, c) for c in [520, 776, 1000, 1024]] + [(torch.float16, 1024)]
_BULK_KERNEL = re.compile(r"norm_bwd_bulk<[^,<>]+, (true|false), (true|false), \d>")


def _skip_unless_sm90():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("norm_bwd_bulk is sm_90 code")


def _bulk_instance(call, kind=None):
    """DSUM of the one norm_bwd_bulk launch call() makes, or None; given the norm's kind,
    also asserts the kernel's form (LAYER) is that norm's."""
    g = _kernel_instance(call, _BULK_KERNEL)
    if g and kind is not None:
        assert (g[1] == "true") == (kind == "layer"), (kind, g)
    return g[0] == "true" if g else None


@CUDA
@pytest.mark.parametrize("stages", ["", "3"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype,cols", BULK_BWD_CASES)
def test_cuda_bulk_backward(dtype, cols, kind, stages, knobs):
    _skip_unless_sm90()
    if stages:
        knobs(f"norm.bwd_bulk_stages={stages}")
    rows = 8 * 132 * 7 + 13
    x = _backward_rows(rows, cols, dtype)
    w, b = _params(kind, (cols,), dtype, "cuda", "same")
    _, mean, rstd = fused_forward(kind, x, [cols], w, b, 1e-5)
    dy = torch.randn_like(x)
    for env, want in [("1", True), ("0", False)]:
        knobs(f"norm.bwd_bulk={env}")
        for dsum in [False, True]:
            call = _add_backward(
                kind, dy, torch.randn_like(x) if dsum else None, x, cols, mean, rstd, w
            )
            assert _bulk_instance(call, kind) == (dsum if want else None), (env, dsum)
    knobs("norm.bwd_bulk=1")
    _check_backward_forms(kind, x, dy, mean, rstd, f"stages={stages}")


@CUDA
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_bulk_backward_many_rows(kind):
    # Over 32 rows a pair (8 pairs an SM at 4 slots): the pair's mean / rstd come 32 rows at
    # a time, so this walks past its first batch into the one loaded while it was used.
    _skip_unless_sm90()
    cols = 1024
    rows = 40 * 8 * torch.cuda.get_device_properties(0).multi_processor_count + 7
    x = _backward_rows(rows, cols, torch.bfloat16)
    w, b = _params(kind, (cols,), torch.bfloat16, "cuda", "same")
    _, mean, rstd = fused_forward(kind, x, [cols], w, b, 1e-5)
    call = _add_backward(kind, torch.randn_like(x), None, x, cols, mean, rstd, w)
    assert _bulk_instance(call, kind) is False
    check_backward(kind, x, [cols], w, b, msg=f"rows={rows}")


@CUDA
def test_cuda_bulk_backward_fallbacks():
    # mean / rstd at any 4-byte offset stay on norm_bwd_bulk (each thread loads them; the same
    # bits as aligned ones); what it leaves to the other kernels: parameters in float32, float32
    # rows, 1032 columns.
    _skip_unless_sm90()
    cols, rows = 1024, 1000
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(w)
    _, mean, rstd = fused_forward("layer", x, [cols], w, b, 1e-5)
    mean1 = torch.empty(rows + 1, device="cuda")[1:].copy_(mean)
    rstd1 = torch.empty(rows + 1, device="cuda")[1:].copy_(rstd)
    want = ops.layer_norm_backward(dy, x, [cols], mean, rstd, w, b, [True, True])
    call = lambda: ops.layer_norm_backward(
        dy,
        x,
        [cols],
        mean1,
        rstd1,
        w,
        b,  # noqa: E731
        [True, True],
    )
    assert _bulk_instance(call) is False
    for g, r in zip(call(), want):
        assert torch.equal(g, r)
    w32, b32 = w.float(), b.float()
    assert (
        _bulk_instance(
            lambda: ops.layer_norm_backward(dy, x, [cols], mean, rstd, w32, b32, [True, True])
        )
        is None
    )
    x32 = x.float()
    _, mean32, rstd32 = fused_forward("layer", x32, [cols], None, None, 1e-5)
    assert (
        _bulk_instance(
            lambda: ops.layer_norm_backward(
                dy.float(), x32, [cols], mean32, rstd32, None, None, [False, False]
            )
        )
        is None
    )
    x2 = torch.randn(rows, 1032, device="cuda", dtype=torch.bfloat16)
    _, mean2, rstd2 = fused_forward("layer", x2, [1032], None, None, 1e-5)
    assert (
        _bulk_instance(
            lambda: ops.layer_norm_backward(
                torch.randn_like(x2), x2, [1032], mean2, rstd2, None, None, [False, False]
            )
        )
        is None
    )


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("residual_in_fp32", [False, True])
@pytest.mark.parametrize(
    "cols", [7, 512, 1024, 4096, 4104, 8192, 8200, 16384, 16392, 32768, 32776, 65536]
)
def test_cuda_add_strategies(dtype, kind, residual_in_fp32, cols):
    rows = _gpu_rows(cols)
    x = torch.randn(rows, cols, device="cuda").to(dtype)
    rdtype = torch.float32 if residual_in_fp32 else dtype
    r = torch.randn(rows, cols, device="cuda").to(rdtype)
    w, b = _params(kind, (cols,), dtype, "cuda", "same")
    check_add(kind, x, r, [cols], w, b, residual_in_fp32, msg=f"cols={cols}")


# Forward and backward captured in a CUDA graph and replayed on new data: the backward
# kernels and column_sum are launched with programmatic dependent launch on sm_90, which a
# graph keeps as programmatic edges. 4104 takes norm_bwd_regs, 12288 norm_bwd_fixed
# (clusters), 12296 norm_bwd_cluster; the replay must match an eager run on the same data.
@CUDA
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cols", [4104, 12288, 12296])
def test_cuda_graph_replay_backward(kind, cols):
    rows = 300
    x = torch.randn(rows, cols, device="cuda").to(torch.bfloat16).requires_grad_()
    w, b = _params(kind, (cols,), torch.bfloat16, "cuda", "same")
    params = [p.requires_grad_() for p in (w, b) if p is not None]
    dy = torch.randn(rows, cols, device="cuda").to(torch.bfloat16)

    def step():
        y = (
            fused_ops.layer_norm(x, (cols,), w, b)
            if kind == "layer"
            else fused_ops.rms_norm(x, (cols,), w)
        )
        return (y, *torch.autograd.grad(y, [x, *params], dy))

    def refill():
        x.copy_(torch.randn(rows, cols, device="cuda"))
        dy.copy_(torch.randn(rows, cols, device="cuda"))

    assert_graph_replay_matches_eager(
        step, refill, ["y", "dx", "dw", "db"], msg=f"{kind} cols={cols}"
    )


@CUDA
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_many_rows(kind):
    # Persistent backward grids: each block visits many rows and merges several row groups'
    # dweight / dbias partials; tiny rows put 256-512 rows in one block.
    for rows, cols in [
        (20000, 1),
        (20000, 7),
        (9000, 64),
        (5000, 1000),
        (3000, 4096),
        (1500, 16384),
        (700, 32768),
        (300, 65536),
    ]:
        x = torch.randn(rows, cols, device="cuda").to(torch.bfloat16)
        w, b = _params(kind, (cols,), torch.bfloat16, "cuda", "fp32")
        check_forward(kind, x, [cols], w, b, msg=f"{rows}x{cols}")
        check_backward(kind, x, [cols], w, b, msg=f"{rows}x{cols}")


@CUDA
@pytest.mark.parametrize(
    "rows,cols,wdtype",
    [(4096, 1024, torch.float32), (8192, 512, torch.bfloat16), (512, 32768, torch.float32)],
)
def test_cuda_deterministic_param_grads(rows, cols, wdtype):
    # 32768: the cluster backward (sm_90) sums the blocks' row sums in a fixed order; 512
    # with bfloat16 parameters: norm_bwd_warp adds its warps' slices in warp order.
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(cols, device="cuda", dtype=wdtype)
    y, mean, rstd = ops.layer_norm(x, [cols], w, w, 1e-5)
    dy = torch.randn_like(x)
    first = ops.layer_norm_backward(dy, x, [cols], mean, rstd, w, w, [True, True])
    for _ in range(3):
        again = ops.layer_norm_backward(dy, x, [cols], mean, rstd, w, w, [True, True])
        for a, b in zip(first, again):
            assert torch.equal(a, b)


@CUDA
def test_cuda_large_mean_long_rows():
    # The long-row kernel's Welford merge at mean 1e4.
    x = 1e4 + torch.randn(4, 70000, device="cuda")
    y, mean, rstd = ops.layer_norm(x, [70000], None, None, 1e-5)
    ry, rmean, rrstd = ref_forward("layer", x, [70000], None, None, 1e-5)
    assert_close(y, ry, rtol=1e-5, atol=2e-3)
    assert_close(rstd, rrstd, rtol=1e-3, atol=0)


@CUDA
def test_cuda_large_tensor_int64_offsets():
    # More than 2^31 elements: row offsets must be 64-bit.
    rows, cols = (1 << 31) // 4096 + 3, 4096
    try:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    except torch.OutOfMemoryError:
        pytest.skip("not enough GPU memory")
    y, _ = ops.rms_norm(x, [cols], None, None)
    tail = x[-3:]
    ry, _, _ = ref_forward("rms", tail, [cols], None, None, torch.finfo(torch.bfloat16).eps)
    assert_close(y[-3:], ry)
