"""fused::linear with a gated activation ("swiglu", "geglu", "geglu_tanh": weight [2N, K],
y = act(z[..., :N]) * z[..., N:], z = x W^T + b) against float64 references, forward and
backward, on CPU and on CUDA once per kernel choice (as tests/test_matmul.py)."""

import math

import pytest
import torch
import torch.nn.functional as F
from test_matmul import DEVICE_KERNELS, KERNELS, check, poison, rand, set_kernel, use

import fused_ops
from fused_ops import reference

from utils import CUDA, DTYPES, TOL, cuda_kernel_names, input_views

GATED = ["swiglu", "geglu", "geglu_tanh"]


@pytest.fixture(params=KERNELS)
def kernel(request, knobs):
    set_kernel(request.param, knobs)
    return request.param


def gate_act(g, act):
    if act == "swiglu":
        return F.silu(g)
    return F.gelu(g, approximate="tanh" if act == "geglu_tanh" else "none")


def gated_of(z, act):
    g, u = z.chunk(2, -1)
    return gate_act(g, act) * u


def gate_act_and_grad(g, act):
    """act(g) and act'(g) in float64."""
    g = g.detach().double().requires_grad_()
    a = gate_act(g, act)
    (da,) = torch.autograd.grad(a.sum(), g)
    return a.detach(), da


def check_either(actual, refs, dtype, z, act, msg=""):
    """Each element within tolerance of at least one of the float64 references (y from the
    exact z, y from z rounded to the dtype: what the composed path, GEMM then the gated
    kernel, computes). The tolerance is y's own (rtol |y| + atol, as check) plus z's
    tolerance (check's, the GEMM's contract) carried through the gate:
        |dy| <= |act'(g) u| tol_z(g) + |act(g)| tol_z(u),  tol_z(v) = rtol |v| + atol_z.
    Why z's error reaches y at full size: where the fp32 accumulator lies next to a 16-bit
    rounding boundary, the GEMM stores the other neighbour than the float64 z rounds to
    (an fp32-vs-fp64 tie break), so each of g and u may be ~0.5 ulp off the exact z and
    1 ulp off the rounded one; for silu / gelu at large g (act'(g) g ~ act(g)) both carry
    their relative error into y in full, on top of y's own rounding: up to ~3 half-ulps of
    relative error, while rtol = 1e-3 is one fp16 ulp at most. In float32 the GEMM's error
    is absolute (cuBLAS sums of K = 4096 products: a few 1e-6, check's 1e-5 floor) and
    |u| or |act'(g) u| up to ~5 multiplies it in y. z itself is checked by check()."""
    rtol, atol = TOL[dtype]
    if dtype == torch.float32:
        atol = max(atol, 1e-5)  # as check: float32 GEMM sums
    a = actual.double()
    z = z.double().to(a.device)
    g, u = z.chunk(2, -1)
    ag, dag = gate_act_and_grad(g, act)
    atol_z = max(atol, 0.1 * rtol * z.abs().mean().item()) if z.numel() else atol
    carried = (dag * u).abs() * (rtol * g.abs() + atol_z) + ag.abs() * (rtol * u.abs() + atol_z)
    ok = torch.zeros_like(a, dtype=torch.bool)
    for r in refs:
        r = r.double().to(a.device)
        scale = r.abs().mean().item() if r.numel() else 0.0
        tol = rtol * r.abs() + max(atol, 0.1 * rtol * scale) + carried
        ok |= (a - r).abs() <= tol
        ok |= a.isnan() & r.isnan()
    if not bool(ok.all()):
        i = (~ok).nonzero()[0].tolist()
        raise AssertionError(
            f"{msg}: {int((~ok).sum())} of {a.numel()} elements off, first at {i}: got "
            f"{a[tuple(i)].item()}, references {[r.double()[tuple(i)].item() for r in refs]}"
        )


def forward_refs(x, w, b, act, dtype):
    """(y references, z reference) in float64: y from the exact z, and from z rounded to the
    dtype (what the composed path computes)."""
    z = F.linear(x.double(), w.double(), None if b is None else b.double())
    return [gated_of(z, act), gated_of(z.to(dtype).double(), act)], z


def gated_linear_case(x_shape, n, dtype, device, with_bias, act, all_views=True):
    K = x_shape[-1]
    for xn, x in list(input_views(x_shape, dtype, device, 1.0))[: None if all_views else 1]:
        wv = list(input_views((2 * n, K), dtype, device, 1.0 / math.sqrt(K)))
        for wn, w in wv[: None if all_views else 2]:
            b = rand((2 * n,), dtype, device) if with_bias else None
            refs, zref = forward_refs(x, w, b, act, dtype)
            msg = f"x={x_shape} {xn} w={wn} N={n} bias={with_bias} act={act}"
            poison([refs[0].numel()], device, dtype)
            y = fused_ops.linear(x, w, b, act)
            assert y.shape == (*x_shape[:-1], n) and y.dtype == dtype
            check_either(y, refs, dtype, zref, act, msg=msg)
            poison([refs[0].numel(), zref.numel()], device, dtype)
            y2, z = torch.ops.fused.linear_fwd(x, w, b, act)
            assert z.shape == (*x_shape[:-1], 2 * n)
            check_either(y2, refs, dtype, zref, act, msg="linear_fwd y " + msg)
            check(z, zref, dtype, msg="linear_fwd z " + msg, k=K)


LINEAR_SHAPES = [((17, 33), 9), ((1, 1), 1), ((2, 3, 40), 24), ((70,), 5), ((64, 129), 100)]


@pytest.mark.parametrize("device_kernel", DEVICE_KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", GATED)
@pytest.mark.parametrize("case", LINEAR_SHAPES)
def test_gated_linear(device_kernel, dtype, act, case, knobs):
    device = use(device_kernel, knobs)
    for with_bias in (True, False):
        gated_linear_case(*case, dtype, device, with_bias, act)


# M, N, K from {1, 17, 127, 1000} and larger; N and K multiples of 8 take the Hopper epilogue
# (with 128- and 256-wide B tiles: few tiles, and >= one tile per SM), the others compose.
CUDA_CASES = [
    ((1, 1000), 17),
    ((17, 127), 1000),
    ((127, 1000), 127),
    ((1000, 17), 1),
    ((1000, 1000), 1000),
    ((1000, 1024), 1000),
    ((4097, 1024), 1536),
    ((3, 700, 512), 2048),
    ((1000, 4096), 4104),
]


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("act", GATED)
@pytest.mark.parametrize("case", CUDA_CASES)
def test_gated_linear_cuda(kernel, dtype, act, case):
    gated_linear_case(*case, dtype, "cuda", True, act, all_views=False)


def hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", GATED)
@pytest.mark.parametrize("mkn", [(256, 512, 256), (4096, 1024, 2048)])
def test_gated_linear_takes_hopper_epilogue(dtype, act, mkn, knobs):
    # On an H100 / H200 both the inference op and the training op (which also stores z) run
    # as one GEMM with the gated epilogue, no separate activation kernel; elsewhere (or with
    # matmul.kernel=portable) a GEMM and the gated kernel.
    M, K, N = mkn
    x = rand((M, K), dtype, "cuda")
    w = rand((2 * N, K), dtype, "cuda", 1.0 / math.sqrt(K))
    b = rand((2 * N,), dtype, "cuda")
    refs, zref = forward_refs(x, w, b, act, dtype)
    for choice in ("auto", "portable"):
        knobs(f"matmul.kernel={choice}")
        fused = hopper() and choice == "auto"
        for name, fn in (
            ("linear", lambda: (torch.ops.fused.linear(x, w, b, act),)),
            ("linear_fwd", lambda: torch.ops.fused.linear_fwd(x, w, b, act)),
        ):
            names = cuda_kernel_names(fn)
            epilogue = [n for n in names if "GatedEpilogue" in n]
            separate = [n for n in names if "gated_kernel" in n]
            assert bool(epilogue) == fused, f"{choice} {name}: {names}"
            assert bool(separate) != fused, f"{choice} {name}: {names}"
            out = fn()
            check_either(out[0], refs, dtype, zref, act, msg=f"{choice} {name} y")
            if name == "linear_fwd":
                check(out[1], zref, dtype, msg=f"{choice} {name} z")


def mirrored_grads(x, w, act, gy, z_saved):
    """float64 gradients at the z the forward saved (z_saved, in the input dtype; the caller
    checks it against float64), rounding dZ to the dtype where the fused backward keeps it
    in it; db the column sums of the rounded dZ (as the kernels). Not at the float64 z
    rounded: where the GEMM's fp32 accumulator lies next to a rounding boundary it stores the
    other neighbour (~0.1% of z's elements in fp16, K = 1000), and the backward differentiates at
    that z: one ulp of z moves a dZ term by ~one ulp, which W then carries into dX beyond
    rtol x a typical term where the term is large."""
    dtype = x.dtype
    xd, wd = x.double(), w.double()
    zr = z_saved.detach().double().reshape(-1, z_saved.shape[-1]).requires_grad_()
    gy = gy.reshape(-1, gy.shape[-1])
    (dz,) = torch.autograd.grad(gated_of(zr, act), zr, gy.double())
    dzr = dz.to(dtype).double()
    dx = (dzr @ wd).reshape(x.shape)
    dw = dzr.t() @ xd.reshape(-1, x.shape[-1])
    return dx, dw, dzr.sum(0)


def backward_case(x_shape, n, dtype, device, with_bias, act, fns):
    K = x_shape[-1]
    x = rand(x_shape, dtype, device).requires_grad_()
    w = rand((2 * n, K), dtype, device, 1.0 / math.sqrt(K)).requires_grad_()
    b = rand((2 * n,), dtype, device).requires_grad_() if with_bias else None
    gy = rand((*x_shape[:-1], n), dtype, device)
    xd, wd, bd = x.detach(), w.detach(), None if b is None else b.detach()
    # The functional op and the op's autograd both save (or recompute) z through linear_fwd.
    z_saved = torch.ops.fused.linear_fwd(xd, wd, bd, act)[1]
    zref = F.linear(xd.double(), wd.double(), None if bd is None else bd.double())
    check(z_saved, zref, dtype, msg=f"linear_fwd z x={x_shape} N={n} act={act}", k=K)
    dx_ref, dw_ref, db_ref = mirrored_grads(xd, wd, act, gy, z_saved)
    for name, fn in fns:
        for t in (x, w, b):
            if t is not None:
                t.grad = None
        fn(x, w, b, act).backward(gy)
        msg = f"{name} x={x_shape} N={n} bias={with_bias} act={act}"
        check(x.grad, dx_ref, dtype, msg=msg + " dx", slack=1.0)
        check(w.grad, dw_ref, dtype, msg=msg + " dw", slack=1.0)
        if with_bias:
            check(b.grad, db_ref, dtype, msg=msg + " db", slack=1.0)


BOTH = (("functional", fused_ops.linear), ("op", torch.ops.fused.linear))


@pytest.mark.parametrize("device_kernel", DEVICE_KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", GATED)
@pytest.mark.parametrize("case", [((33, 70), 17), ((2, 9, 40), 64), ((5,), 3), ((300, 64), 48)])
def test_gated_linear_backward(device_kernel, dtype, act, case, knobs):
    # The training path (linear_fwd saves z) and the inference op's autograd (recomputes z).
    device = use(device_kernel, knobs)
    for with_bias in (True, False):
        backward_case(*case, dtype, device, with_bias, act, BOTH)


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", GATED)
@pytest.mark.parametrize("mkn", [(1000, 1000, 127), (4096, 1024, 2048)])
def test_gated_linear_backward_cuda_large(kernel, dtype, act, mkn):
    M, K, N = mkn
    backward_case((M, K), N, dtype, "cuda", True, act, BOTH[:1])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", GATED)
def test_linear_act_backward_gated(device, dtype, act):
    z = rand((37, 2 * 24), dtype, device, 2.0)
    g = rand((37, 24), dtype, device)
    zr = z.double().requires_grad_()
    (dz_ref,) = torch.autograd.grad(gated_of(zr, act), zr, g.double())
    poison([z.numel()], device, dtype)
    dz, db = torch.ops.fused.linear_act_backward(g, z, act, True)
    check(dz, dz_ref, dtype)
    check(db, dz.double().sum(0), dtype, slack=1.0)
    assert torch.ops.fused.linear_act_backward(g, z, act, False)[1].shape == (0,)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_empty(device, dtype):
    x = torch.randn(4, 6, device=device, dtype=dtype)
    assert fused_ops.linear(x, x[:0], None, "swiglu").shape == (4, 0)
    y, z = torch.ops.fused.linear_fwd(x[:0], x, None, "geglu")
    assert y.shape == (0, 2) and z.shape == (0, 4)
    dz, db = torch.ops.fused.linear_act_backward(y, z, "geglu", True)
    assert dz.shape == (0, 4) and torch.equal(db, torch.zeros_like(db)) and db.shape == (4,)


@pytest.mark.parametrize("act", GATED)
def test_gradcheck_float64(act):
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(10, 6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(10, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: fused_ops.linear(*t, act), (x, w, b))
    assert torch.autograd.gradcheck(lambda *t: torch.ops.fused.linear(*t, act), (x, w, b))
    assert torch.autograd.gradgradcheck(lambda *t: fused_ops.linear(*t, act), (x, w, b))


@pytest.mark.parametrize("act", GATED)
def test_torch_func(act):
    x = torch.randn(3, 6, dtype=torch.float64)
    w = torch.randn(8, 6, dtype=torch.float64)
    got = torch.func.grad(lambda t: fused_ops.linear(x, t, None, act).sum())(w)
    want = torch.func.grad(lambda t: reference.linear(x, t, None, act).sum())(w)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_opcheck(device):
    dt = torch.float32 if device == "cpu" else torch.bfloat16
    x = torch.randn(5, 8, device=device, dtype=dt, requires_grad=True)
    w = torch.randn(16, 8, device=device, dtype=dt, requires_grad=True)
    b = torch.randn(16, device=device, dtype=dt, requires_grad=True)
    ops = torch.ops.fused
    for act in GATED:
        torch.library.opcheck(ops.linear.default, (x, w, b, act))
        torch.library.opcheck(ops.linear.default, (x, w, None, act))
        torch.library.opcheck(ops.linear_fwd.default, (x, w, b, act))
        z = torch.randn(5, 16, device=device, dtype=dt)
        g = torch.randn(5, 8, device=device, dtype=dt)
        torch.library.opcheck(ops.linear_act_backward.default, (g, z, act, True))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_compile_fullgraph(device):
    torch._dynamo.reset()
    x = torch.randn(6, 16, device=device, requires_grad=True)
    w = (torch.randn(24, 16, device=device) / 4).requires_grad_()

    def f(x, w):
        return fused_ops.linear(x, w, None, "swiglu").sum()

    out = torch.compile(f, fullgraph=True)(x, w)
    out.backward()
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want = reference.linear(xr, wr, None, "swiglu").sum()
    want.backward()
    check(out.detach(), want.detach(), torch.float32)
    check(x.grad, xr.grad, torch.float32, slack=1.0)
    check(w.grad, wr.grad, torch.float32, slack=1.0)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_bad_inputs(device):
    x = torch.randn(4, 6, device=device)
    w = torch.randn(7, 6, device=device)
    with pytest.raises(RuntimeError, match=r"expected an even number of rows.*\[7, 6\]"):
        fused_ops.linear(x, w, None, "swiglu")
    with pytest.raises(RuntimeError, match=r"expected an even number of rows.*\[7, 6\]"):
        torch.ops.fused.linear_fwd(x, w, None, "geglu")
    with pytest.raises(RuntimeError, match=r"bias of shape \[8\].*\[4\]"):
        fused_ops.linear(
            x, torch.randn(8, 6, device=device), torch.randn(4, device=device), "swiglu"
        )
    with pytest.raises(RuntimeError, match="'swiglu', 'geglu' or 'geglu_tanh', but got 'glu'"):
        fused_ops.linear(x, w, None, "glu")
    z = torch.randn(4, 8, device=device)
    with pytest.raises(RuntimeError, match=r"preact \[..., 2N\] and grad_out \[..., N\]"):
        torch.ops.fused.linear_act_backward(z, z, "swiglu", True)
    with pytest.raises(RuntimeError, match="same dtype"):
        fused_ops.linear(x, w.half(), None, "swiglu")
